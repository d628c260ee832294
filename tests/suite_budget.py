"""The whole suite's time against its budget: CI refuses a submission whose `make test` passes 30 minutes, so the
suite fails itself, naming its time and the budget, long before that (`suite_budget_s` in pyproject's pytest
options; `TOOLKIT_SUITE_BUDGET_S` overrides it, 0 turns the guard off). Only a run of the whole suite (pytest's
`testpaths`, as `make test` runs it) is judged; a run of some files is not. `--durations=25` prints the slowest."""
from __future__ import annotations

import os
import time

import pytest

BUDGET_OPTION = "suite_budget_s"
BUDGET_ENV = "TOOLKIT_SUITE_BUDGET_S"
_STARTED = pytest.StashKey[float]()
_VERDICT = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(BUDGET_OPTION, "seconds the whole suite may take before it fails itself (0: no budget)",
                  default="0")


def budget_s(config: pytest.Config) -> float:
    return float(os.environ.get(BUDGET_ENV) or config.getini(BUDGET_OPTION))


def judged(config: pytest.Config) -> bool:
    """A whole-suite run in the process that reports (pytest-xdist's controller, or a run without workers)."""
    is_worker = hasattr(config, "workerinput")
    return not is_worker and config.args_source == pytest.Config.ArgsSource.TESTPATHS and budget_s(config) > 0


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not judged(config):
        return
    elapsed, budget = time.monotonic() - config.stash[_STARTED], budget_s(config)
    if elapsed <= budget:
        config.stash[_VERDICT] = f"suite time {elapsed:.0f} s of its {budget:.0f} s budget"
        return
    config.stash[_VERDICT] = (
        f"FAILED: the suite took {elapsed:.0f} s, over its budget of {budget:.0f} s ({BUDGET_OPTION} in "
        f"pyproject.toml). CI refuses a submission whose `make test` passes 30 minutes: make the slowest tests "
        f"above cheaper (share their servers, run them side by side) rather than raising the budget.")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    verdict = config.stash.get(_VERDICT, None)
    if verdict is not None:
        terminalreporter.write_sep("=", verdict, red=verdict.startswith("FAILED"), bold=True)
