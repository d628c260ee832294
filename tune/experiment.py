"""One step's I/O: launch the server with a configuration, run the workload R times, stop it, diagnose its log.

Three small interfaces, so the loop (and the tests) can swap any of them: a `Launcher` starts a healthy `Server`
(or raises `LaunchError`), a `Workload` runs the load once against it and returns the objective with the bench
records, a `Doctor` turns the server log of that window into findings. `Experiment` composes them into the
loop's `Measure`; a launch that fails, a server that dies mid-run or a run where every request failed makes a
failed `Trial`, never an exception. Every step gets its own folder (`step-NN/`) with the server's log.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from toolkit.tune.flags import Advice, Flags
from toolkit.tune.launcher import LaunchError
from toolkit.tune.loop import Trial

Event = Callable[[int, str], None]


class Server(Protocol):
    url: str
    log: Path

    def alive(self) -> bool: ...

    def stop(self) -> object: ...


class Launcher(Protocol):
    def log_path(self, folder: Path) -> Path:
        """Where the server launched into `folder` writes the log that diagnose reads."""

    def launch(self, flags: Flags, folder: Path) -> Server:
        """A started, healthy server; raises `LaunchError` (after stopping it) when it exits or never gets healthy."""


class Workload(Protocol):
    def run(self, server: Server, repeat: int) -> tuple[float, list[dict]]:
        """One measurement: (objective value, its bench records). Raises KeyboardInterrupt when interrupted."""


class Doctor(Protocol):
    def diagnose(self, log: Path, records: Sequence[dict]) -> tuple[tuple[Advice, ...], str | None]:
        """(findings, verdict) for the log over the records' time window (the whole log without records)."""


class RunError(RuntimeError):
    """The workload could not run against this server (it refused, or every request failed)."""


def _short(message: str, lines: int = 3) -> str:
    text = [line.rstrip() for line in message.splitlines() if line.strip()]
    return " … ".join(text[:1] + text[-lines + 1:]) if len(text) > lines else " ".join(text)


class Experiment:
    def __init__(self, launcher: Launcher, workload: Workload, doctor: Doctor, repeats: int, out_dir: Path,
                 on_event: Event | None = None, clock: Callable[[], float] = time.monotonic):
        self.launcher, self.workload, self.doctor = launcher, workload, doctor
        self.repeats = repeats
        self.out_dir = out_dir
        self.on_event = on_event or (lambda index, what: None)
        self.clock = clock

    def __call__(self, flags: Flags, index: int) -> Trial:
        folder = self.out_dir / f"step-{index:02d}"
        began = self.clock()
        self.on_event(index, "launching")
        try:
            server = self.launcher.launch(flags, folder)
        except LaunchError as exc:
            log = self.launcher.log_path(folder)
            findings, verdict = self.doctor.diagnose(log, []) if log.is_file() else ((), None)
            return Trial(findings=findings, verdict=verdict, error=f"launch failed: {_short(str(exc))}",
                         folder=str(folder), seconds=self.clock() - began)
        values, records, error = self._runs(server, index)
        self.on_event(index, "diagnosing")
        findings, verdict = self.doctor.diagnose(server.log, records)
        return Trial(tuple(values), findings, tuple(records), verdict, error, str(folder), self.clock() - began)

    def _runs(self, server: Server, index: int) -> tuple[list[float], list[dict], str | None]:
        values: list[float] = []
        records: list[dict] = []
        try:
            for repeat in range(self.repeats):
                self.on_event(index, f"run {repeat + 1}/{self.repeats}")
                value, runs = self.workload.run(server, repeat)
                records.extend(runs)
                if not server.alive():
                    return values, records, "the server exited during the run"
                if runs and all(r.get("completed", 0) == 0 for r in runs):
                    return values, records, f"every request failed ({runs[-1].get('errors') or 'no tokens'})"
                values.append(value)
        except RunError as exc:
            return values, records, str(exc)
        finally:
            self.on_event(index, "stopping the server")
            server.stop()
        return values, records, None
