"""`analyze(...) -> Diagnosis`: the pure API behind `toolkit diagnose` (and `toolkit report`).

The verdict says what was read and whether it was enough: "OK" only when the load series (decode lines, or
vLLM's stats lines) had enough steady lines for the load rules and they found nothing; "NOT ENOUGH DATA" with
the reason otherwise (an empty log, a log of another program, start-up lines only, an excerpt too short).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.diagnose.advice import launch_command
from toolkit.diagnose.bench_input import BenchInput, read_bench
from toolkit.diagnose.config import ServerConfig, read_config
from toolkit.diagnose.findings import SEVERITIES, Finding, rank_of
from toolkit.diagnose.metrics_input import Metrics, read_metrics
from toolkit.diagnose.read.lines import ParseStats
from toolkit.diagnose.read.logs import Tap, read_logs
from toolkit.diagnose.rules import Context, run_rules
from toolkit.diagnose.rules.context import MIN_LINES
from toolkit.diagnose.timeline import Timeline, build_timeline

_VERDICTS = {"critical": "CRITICAL", "warning": "NEEDS TUNING", "info": "OK, with suggestions", None: "OK"}
NOT_ENOUGH = "NOT ENOUGH DATA"


@dataclass(slots=True)
class Diagnosis:
    """The result: findings (most severe first), the timeline they were read from, what was parsed, and the
    rules that could not judge (`unjudged`: (rule, why))."""

    sources: list[str]
    stats: ParseStats
    timeline: Timeline
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    command: str | None = None
    metrics: Metrics | None = None
    bench: BenchInput | None = None
    window: tuple[float, float] | None = None
    unjudged: list[tuple[str, str]] = field(default_factory=list)

    @property
    def config(self) -> ServerConfig:
        return self.timeline.config

    @property
    def worst(self) -> str | None:
        return max((f.severity for f in self.findings), key=rank_of, default=None)

    @property
    def enough_data(self) -> bool:
        """Whether the load rules had enough to judge: at least MIN_LINES steady load lines."""
        return len(self.timeline.steady()) >= MIN_LINES

    @property
    def status(self) -> str:
        """The most severe finding's severity; else "ok", or "insufficient" when the load was not judged."""
        if self.worst is not None:
            return self.worst
        return "ok" if self.enough_data else "insufficient"

    @property
    def data_problem(self) -> str | None:
        """Why the load could not be judged, None when it could."""
        if self.enough_data:
            return None
        stats = self.stats
        if stats.lines == 0:
            return "the log is empty"
        load = self.timeline.load()
        word = "stats" if self.timeline.load_kind == "stats" else "decode"
        events = sum(stats.kinds.values())
        if events == 0:
            unread = f" ({stats.unread} unreadable)" if stats.unread else ""
            return f"no SGLang or vLLM log line was recognised in {stats.lines} lines{unread}"
        if len(load) == 0:
            kinds = ", ".join(f"{n} {k}" for k, n in stats.kinds.most_common(4))
            return f"no decode or stats lines to judge the load by (read: {kinds})"
        span = self.timeline.span
        seconds = f" over {span[1] - span[0]:.0f} s" if span else ""
        steady = len(self.timeline.steady())
        return (f"{len(load)} {word} lines{seconds}, {steady} of them steady: the load rules need at least "
                f"{MIN_LINES} steady ones")

    @property
    def verdict(self) -> str:
        """One line: the status word, then the most severe finding's title, or what was read."""
        problem = self.data_problem
        if self.findings:
            counts = ", ".join(f"{n} {s}" for s in reversed(SEVERITIES)
                               if (n := sum(f.severity == s for f in self.findings)))
            first = self.findings[0]
            sure = "" if first.confidence == "high" else f", {first.confidence} confidence"
            text = f"{_VERDICTS[self.worst]}: {first.title} ({counts}{sure})"
            return text + (f"; load not judged: {problem}" if problem else "")
        if problem:
            return f"{NOT_ENOUGH}: {problem}"
        load = len(self.timeline.load())
        word = "stats" if self.timeline.load_kind == "stats" else "decode"
        return (f"OK: no problems found in {self.stats.lines} lines ({load} {word} lines, "
                f"{len(self.timeline.steady())} steady)")

    def fails(self, threshold: str) -> bool:
        """True when a finding is at least as severe as `threshold` (for `--fail-on`)."""
        return any(rank_of(f.severity) >= rank_of(threshold) for f in self.findings)


def analyze(
    paths: Sequence[str | Path] = (),
    *,
    lines: Iterable[str] | None = None,
    metrics: str | Metrics | None = None,
    bench: str | BenchInput | None = None,
    window: tuple[float, float] | None = None,
    tap: Tap | None = None,
) -> Diagnosis:
    """Parse logs (`paths`: files, `.gz`, or `-` for stdin; and/or `lines`), build the timeline, run the rules.

    `window=(t0, t1)` keeps only time-series events inside it, in the log's clock (naive timestamps read
    as UTC; `diagnose.bench_input.to_log_clock` converts a unix time); start-up lines are always kept.
    `metrics` is a scrape file/URL (or parsed `Metrics`), `bench` a `toolkit bench` JSONL file; `tap` sees every
    event of `paths` as they are read (`--export`: `export.EventStash`).
    Raises `ValueError` for unreadable metrics/bench inputs and `OSError` for unreadable logs."""
    stats = ParseStats()
    records = read_logs(paths, lines, stats, window, tap=tap)
    config = read_config(records)
    timeline = build_timeline(records.batches, records.events, config)
    scrape = read_metrics(metrics) if isinstance(metrics, str) else metrics
    run = read_bench(bench) if isinstance(bench, str) else bench
    ctx = Context(timeline, scrape, run)
    findings = sorted(run_rules(ctx), key=lambda f: -rank_of(f.severity))
    sources = [str(p) for p in paths] + (["<lines>"] if lines is not None else [])
    return Diagnosis(sources, stats, timeline, findings, ctx.notes, launch_command(config, findings), scrape, run,
                     window, ctx.unjudged)
