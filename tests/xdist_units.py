"""How `make test` splits the suite between pytest-xdist's workers (`-n 2 --dist loadgroup`).

A unit of work is a test file (its module-scoped servers start once, and tests that read what an earlier one left
in a server's log stay in order), or a named group across files: every test that talks to one of the
session-scoped servers of `tests/server/conftest.py` joins that server's group, so the server starts once a run,
not once a worker. Units with a `slow` test go first, in collection order, and units with a `solo` test last: the
longest start early and the run does not end on one worker while the other idles.

The workers name each test's unit in a file the controller's scheduler reads (`units.json` in the run's temp
folder). NOTE: xdist's own `xdist_group` mark renames node ids, which pytest 9.2 no longer lets a plugin do (its
node id is derived, not stored): the groups were silently ignored and each worker started its own shared servers."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.solo import MARK as SOLO

# session-scoped fixtures that start a server, by unit name
SHARED_SERVERS = {"server": "shared-server", "keyed_server": "shared-keyed-server"}
UNITS_FILE = "units.json"


def unit_of(item: pytest.Item) -> str:
    """The unit a test runs in: its shared server's group, or its file."""
    for fixture, group in SHARED_SERVERS.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    return item.nodeid.split("::", 1)[0]


def _units_path(run_folder: Path) -> Path:
    return run_folder / UNITS_FILE


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with our units as scopes, queued in collection order (slow units first)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # NOTE: xdist would queue the units with most tests first
        self._run_folder = config._tmp_path_factory.getbasetemp()
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            # NOTE: read once every worker has collected: each wrote the file before reporting its collection (a
            # worker that failed to collect wrote none: then each file is a unit)
            path = _units_path(self._run_folder)
            self._units = json.loads(path.read_text()) if path.is_file() else {}
        return self._units.get(nodeid) or nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> UnitScheduling | None:
    return UnitScheduling(config, log) if config.getoption("dist") == "loadgroup" else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_units = {unit_of(item) for item in items if item.get_closest_marker("slow")}
    solo_units = {unit_of(item) for item in items if item.get_closest_marker(SOLO)}

    def place(item: pytest.Item) -> int:
        # NOTE: a solo test idles the other worker while it runs: last, where little else is left to wait
        unit = unit_of(item)
        return 2 if unit in solo_units else 0 if unit in slow_units else 1

    items.sort(key=place)  # a stable sort: the order inside a unit stays


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On a worker, before it reports its collection: every final node id with its unit."""
    config = session.config
    if not hasattr(config, "workerinput"):
        return
    # NOTE: a worker's base temp is <the run's base temp>/popen-gw<n> (tests/solo.py reads it the same way)
    path = _units_path(config._tmp_path_factory.getbasetemp().parent)
    staging = path.with_name(f"{path.name}.{os.getpid()}")
    staging.write_text(json.dumps({item.nodeid: unit_of(item) for item in session.items}))
    staging.replace(path)  # both workers write the same map; a rename is atomic
