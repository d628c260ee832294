"""A scripted world for the loop's tests: a configuration's measured objective and findings as plain functions of
its flags, a fake clock, and a measure that records what the loop asked for."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.diagnose.findings import Current
from toolkit.diagnose.vocabulary import Change
from toolkit.tune.flags import Flags
from toolkit.tune.launcher import LaunchError
from toolkit.tune.loop import Trial


@dataclass(frozen=True)
class Advice:
    id: str
    severity: str
    change: Change | None
    current: Current | None = None
    title: str = "a finding"
    serves: str = "throughput"


LOW_USAGE = Advice("usage.low_while_queued", "warning", Change("admission", "0.3"), Current.of(2))
TRY_LPM = Advice("schedule_policy.try_lpm", "info", Change("schedule_policy", "lpm"), Current.of("fcfs"))
CLIENT = Advice("queue.empty", "warning", None)


@dataclass
class World:
    """`objective(flags) -> repeats` and `findings(flags) -> advices`; `fails(flags)` makes the launch fail."""

    objective: Callable[[Flags], tuple[float, ...]]
    findings: Callable[[Flags], tuple[Advice, ...]] = lambda flags: ()
    fails: Callable[[Flags], bool] = lambda flags: False
    step_seconds: float = 60.0
    now: float = 0.0
    asked: list[Flags] = field(default_factory=list)
    interrupt_at: int | None = None

    def clock(self) -> float:
        return self.now

    def __call__(self, flags: Flags, index: int) -> Trial:
        self.asked.append(flags)
        self.now += self.step_seconds
        if self.interrupt_at is not None and index == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fails(flags):
            return Trial(error="launch failed: the server exited with code 1", seconds=self.step_seconds)
        return Trial(self.objective(flags), self.findings(flags), seconds=self.step_seconds)


def flag(flags: Flags, name: str, default: str) -> str:
    value = flags.get(name)
    return default if value is None else str(value)


# Fakes for `tune.experiment`'s three interfaces.
@dataclass
class FakeServer:
    log: Path
    flags: Flags = field(default_factory=Flags)
    url: str = "http://127.0.0.1:1"
    dies_after: int | None = None
    runs: int = 0
    stopped: bool = False

    def alive(self) -> bool:
        return self.dies_after is None or self.runs < self.dies_after

    def stop(self) -> int:
        self.stopped = True
        return 0


@dataclass
class FakeLauncher:
    """Writes `log_line` (default: the flags) as the server's log; fails every launch with `fail`, or those
    `fails(flags)` picks."""

    fail: str | None = None
    dies_after: int | None = None
    log_line: str | None = None
    fails: Callable[[Flags], bool] = lambda flags: False
    servers: list[FakeServer] = field(default_factory=list)

    def log_path(self, folder: Path) -> Path:
        return folder / "server.log"

    def launch(self, flags: Flags, folder: Path) -> FakeServer:
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path(folder).write_text((self.log_line or flags.text()) + "\n")
        if self.fail or self.fails(flags):
            raise LaunchError(self.fail or "the server exited with code 1")
        server = FakeServer(self.log_path(folder), flags, dies_after=self.dies_after)
        self.servers.append(server)
        return server


@dataclass
class FakeWorkload:
    values: list[float]
    completed: int = 10
    raise_at: int | None = None
    error: Exception | None = None

    def run(self, server: FakeServer, repeat: int) -> tuple[float, list[dict]]:
        server.runs += 1
        if self.raise_at == repeat:
            raise self.error
        return self.values[repeat], [{"completed": self.completed, "errors": {"http_500": 3}, "repeat": repeat}]


@dataclass
class FakeDoctor:
    seen: list[tuple[Path, int]] = field(default_factory=list)

    def diagnose(self, log: Path, records) -> tuple[tuple, str]:
        self.seen.append((log, len(records)))
        return (LOW_USAGE,), f"read {log.read_text().strip()}"


@dataclass
class WorldWorkload:
    """The world's objective for the launched flags, as bench-like records; Ctrl-C on the `interrupt_at`-th run."""

    world: World
    interrupt_at: int | None = None
    runs: int = 0

    def run(self, server: FakeServer, repeat: int) -> tuple[float, list[dict]]:
        self.runs += 1
        server.runs += 1
        if self.runs == self.interrupt_at:
            raise KeyboardInterrupt
        value = self.world.objective(server.flags)[repeat]
        return value, [{"completed": 24, "output_throughput": value, "request_rate": "inf", "duration": 10.0}]


@dataclass
class WorldDoctor:
    """The world's findings for the flags the fake launcher wrote into the log."""

    world: World

    def diagnose(self, log: Path, records) -> tuple[tuple, str]:
        findings = self.world.findings(Flags.parse(log.read_text().strip()))
        return findings, f"{len(findings)} findings"
