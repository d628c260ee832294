"""The real `toolkit serve` for tests: `tune.launcher.ServerProcess` on 127.0.0.1 and a free port, plus what the
tests look at (its log file, its scheduler child, /proc)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.machine_speed import scaled
from toolkit.tune import launcher

STARTUP_TIMEOUT = 180.0


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): tells a process from a later one reusing its pid."""
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, started: int | None = None) -> bool:
    """The process runs (a zombie does not count); with `started`, only that very process counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


def family(pid: int) -> dict[int, int | None]:
    """The process's children with their start times, for `alive(pid, started)` later."""
    return {child: start_time(child) for child in children_of(pid)}


class ServerProcess(launcher.ServerProcess):
    def __init__(self, *flags: str, log_file: Path | None = None) -> None:
        port = launcher.free_port()
        output = Path(os.environ.get("TMPDIR", "/tmp")) / f"toolkit-serve-{port}.out"
        super().__init__(launcher.serve_command(port, *flags, log_file=log_file), port, output)
        self.log_file = log_file

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> ServerProcess:
        super().wait_healthy(scaled(timeout))
        return self

    def scheduler_pid(self) -> int:
        (pid,) = [p for p in children_of(self.pid) if "multiprocessing.spawn" in cmdline(p)]
        return pid

    def output(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.output_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return self.output_tail(lines)

    def health_until_exit(self, seconds: float = 10.0) -> list[int | str]:
        """/health's answers (a status, or "refused") polled until the server exits or `seconds` pass."""
        statuses: list[int | str] = []
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                statuses.append(requests.get(f"{self.url}/health", timeout=1).status_code)
            except requests.ConnectionError:
                statuses.append("refused")
            time.sleep(0.05)
        return statuses


def run_to_the_end(command: list[str], timeout: float,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs a `toolkit` command that starts servers (tune, demo); past `timeout` it gets SIGTERM (their Ctrl-C: they
    stop their servers and write what they have), then its whole process group is killed, so no server outlives a
    slow run."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=env)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            out, err = process.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"{command[3]} ran past {timeout:.0f} s: {(out + err)[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, err)
