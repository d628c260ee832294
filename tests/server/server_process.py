"""Start the real `toolkit serve` as a subprocess on 127.0.0.1 and a free port; stop it; find its children."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

STARTUP_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (Path("/proc") / str(pid) / "stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ServerProcess:
    def __init__(self, *flags: str, log_file: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file
        args = [sys.executable, "-m", "toolkit.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                *flags]
        if log_file is not None:
            args += ["--log-file", str(log_file)]
        self.output = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"toolkit-serve-{self.port}.out", "w+")
        self.proc = subprocess.Popen(args, stdout=self.output, stderr=subprocess.STDOUT)

    def wait_healthy(self) -> ServerProcess:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not healthy within {STARTUP_TIMEOUT} s:\n{self.log_tail()}")

    def scheduler_pid(self) -> int:
        (pid,) = [p for p in children_of(self.proc.pid) if "multiprocessing.spawn" in cmdline(p)]
        return pid

    def log_tail(self, lines: int = 40) -> str:
        self.output.flush()
        self.output.seek(0)
        return "".join(self.output.readlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.output.close()
        return self.proc.returncode
