"""`make test`'s units of work (tests/xdist_units.py), run for real on two pytest-xdist workers over a made-up suite:
every test that uses a shared server's fixture runs on one worker, whichever file it is in, so that server starts
once a run; the other tests go by file."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """
import os
import pytest

pytest_plugins = ["tests.xdist_units"]


@pytest.fixture(scope="session")
def server():
    return os.environ["PYTEST_XDIST_WORKER"]


def pytest_runtest_setup(item):
    with open(os.environ["SEEN_FILE"], "a") as seen:
        seen.write(f"{os.environ['PYTEST_XDIST_WORKER']} {item.nodeid}\\n")
"""

SERVER_TESTS = """
import time


def test_{name}_talks_to_the_server(server):
    time.sleep(0.2)


def test_{name}_alone():
    time.sleep(0.2)
"""


def test_a_shared_servers_tests_run_on_one_worker_across_files(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("a", "b", "c", "d"):
        (suite / f"test_{name}.py").write_text(textwrap.dedent(SERVER_TESTS.format(name=name)))
    seen = tmp_path / "seen.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "temp"), "--rootdir", str(suite), str(suite)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SEEN_FILE": str(seen)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for line in seen.read_text().splitlines():
        worker, nodeid = line.split(" ", 1)
        workers.setdefault(nodeid, set()).add(worker)
    assert len(workers) == 8, workers
    with_server = {worker for nodeid, (worker,) in workers.items() if "talks_to_the_server" in nodeid}
    assert len(with_server) == 1 and len(set().union(*workers.values())) == 2, workers
    units = json.loads((tmp_path / "temp" / "units.json").read_text())
    assert {unit for nodeid, unit in units.items() if "talks_to_the_server" in nodeid} == {"shared-server"}
    assert units["test_a.py::test_a_alone"] == "test_a.py"
