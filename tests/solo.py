"""Tests that judge speed run with the machine to themselves.

`make test` runs the suite on pytest-xdist's workers, side by side. A test marked `solo` (it keeps a flag only if
throughput rises, say) would read the other worker's load as its own noise, so the workers share one
reader-writer lock across processes: every test holds it shared, a solo test holds it alone, and the processes it
starts get every core. A solo test that waits for it holds the turnstile, so no other test starts meanwhile (a
writer is never starved). Without workers there is nothing to share and nothing is locked."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

MARK = "solo"


class MachineLock:
    """flock(2) on two files in a folder every worker of one run names alike: `turnstile`, then `machine`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(exist_ok=True)
        self._turnstile = open(folder / "turnstile", "a+")  # noqa: SIM115 (held for the worker's life)
        self._machine = open(folder / "machine", "a+")  # noqa: SIM115

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._holding(self._turnstile, fcntl.LOCK_EX):
            fcntl.flock(self._machine, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._machine, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._holding(self._turnstile, fcntl.LOCK_EX), self._holding(self._machine, fcntl.LOCK_EX), \
                _every_core():
            yield

    @staticmethod
    @contextlib.contextmanager
    def _holding(file, operation: int) -> Iterator[None]:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@contextlib.contextmanager
def _every_core() -> Iterator[None]:
    """The processes a solo test starts run as many threads as the machine has cores (tests/conftest.py gives the
    workers' processes one)."""
    threads = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        yield
    finally:
        if threads is not None:
            os.environ["OMP_NUM_THREADS"] = threads


_LOCK = pytest.StashKey[MachineLock]()


def _lock(config: pytest.Config) -> MachineLock | None:
    """The run's lock, on a worker of pytest-xdist; None without workers."""
    if not hasattr(config, "workerinput"):
        return None
    if _LOCK not in config.stash:
        # NOTE: a worker's base temp is <the run's base temp>/popen-gw<n>: the parent is the run's, and pytest
        # removes it with the run's other temp folders
        run_folder = config._tmp_path_factory.getbasetemp().parent
        config.stash[_LOCK] = MachineLock(run_folder / "solo-lock")
    return config.stash[_LOCK]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    lock = _lock(item.config)
    if lock is None:
        return (yield)
    with lock.alone() if item.get_closest_marker(MARK) else lock.shared():
        return (yield)
