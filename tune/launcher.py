"""A server under our control: start any serving command in its own process group on 127.0.0.1, wait until
`/health` answers, stop it (SIGTERM, then SIGKILL to the whole group). Used by `toolkit demo`, `toolkit tune`,
the project's benchmarks and the tests, so no caller keeps its own copy."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HEALTH_POLL_SECONDS = 0.25


class LaunchError(RuntimeError):
    """The server exited or never became healthy; the message carries the tail of its output."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def toolkit_command(*args: str) -> list[str]:
    """`toolkit ARGS` with this interpreter (works from a checkout and from an installed wheel)."""
    return [sys.executable, "-m", "toolkit.cli", *args]


def serve_command(port: int, *flags: str, log_file: Path | None = None) -> list[str]:
    command = toolkit_command("serve", "--host", "127.0.0.1", "--port", str(port), *flags)
    return command + (["--log-file", str(log_file)] if log_file is not None else [])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class ServerProcess:
    """One server process; its stdout and stderr go to `output_path`."""

    def __init__(self, command: list[str], port: int, output_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = command
        self.output_path = output_path
        output_path.parent.mkdir(parents=True, exist_ok=True)
        self._output = open(output_path, "w+")
        # NOTE: a session of its own, so stop() reaches the scheduler and any other child too.
        self.proc = subprocess.Popen(command, stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env)

    @classmethod
    def toolkit_serve(cls, *flags: str, log_file: Path | None = None, output_path: Path | None = None) -> ServerProcess:
        port = free_port()
        output = output_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"toolkit-serve-{port}.out"
        return cls(serve_command(port, *flags, log_file=log_file), port, output)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout: float) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LaunchError(f"the server exited with code {self.proc.returncode}:\n{self.output_tail()}")
            if _healthy(self.url):
                return self
            time.sleep(HEALTH_POLL_SECONDS)
        self.stop()
        raise LaunchError(f"the server was not healthy within {timeout:.0f} s:\n{self.output_tail()}")

    def output_tail(self, lines: int = 40) -> str:
        self._output.flush()
        self._output.seek(0)
        return "".join(self._output.readlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM the server, wait `timeout`, then SIGKILL its whole process group; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.proc.wait(timeout)
        self._kill_group()  # NOTE: children that outlived their parent (a crash) must not leak
        if not self._output.closed:
            self._output.close()
        return self.proc.returncode

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
