"""How `make test` splits the suite between pytest-xdist's workers (`-n 2 --dist loadgroup`).

A unit of work is a test file (its module-scoped servers start once, and tests that read what an earlier one left
in a server's log stay in order), or a named group across files: every test that talks to one of the
session-scoped servers of `tests/server/conftest.py` joins that server's group, so the server starts once a run,
not once a worker. Files with a `slow` test go first: the longest units start early and the run does not end
on one worker while the other idles."""
from __future__ import annotations

import pytest
from xdist.scheduler import LoadGroupScheduling

# session-scoped fixtures that start a server, by group name
SHARED_SERVERS = {"server": "shared-server", "keyed_server": "shared-keyed-server"}


class FileOrGroupScheduling(LoadGroupScheduling):
    def _split_scope(self, nodeid: str) -> str:
        group = super()._split_scope(nodeid)
        return group if group != nodeid else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> FileOrGroupScheduling | None:
    return FileOrGroupScheduling(config, log) if config.getoption("dist") == "loadgroup" else None


@pytest.hookimpl(tryfirst=True)  # NOTE: before xdist's own hook names each item's group in its node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in SHARED_SERVERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: the order inside stays
