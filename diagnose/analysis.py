"""`analyze(...) -> Diagnosis`: the pure API behind `toolkit diagnose` (and `toolkit report`)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.diagnose.advice import launch_command
from toolkit.diagnose.bench_input import BenchInput, read_bench
from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import SEVERITIES, Finding, rank_of
from toolkit.diagnose.hotlines import HotBlock
from toolkit.diagnose.metrics_input import Metrics, read_metrics
from toolkit.diagnose.parser import ParseStats, Parser, Row, row_batches
from toolkit.diagnose.rules import Context, run_rules
from toolkit.diagnose.timeline import Timeline, build_timeline

_VERDICTS = {
    "critical": "CRITICAL",
    "warning": "NEEDS TUNING",
    "info": "OK, with suggestions",
    None: "OK",
}


@dataclass(slots=True)
class Diagnosis:
    """The result: findings (most severe first), the timeline they were read from, and what was parsed."""

    sources: list[str]
    stats: ParseStats
    timeline: Timeline
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    command: str | None = None
    metrics: Metrics | None = None
    bench: BenchInput | None = None
    window: tuple[float, float] | None = None

    @property
    def config(self) -> ServerConfig:
        return self.timeline.config

    @property
    def worst(self) -> str | None:
        return max((f.severity for f in self.findings), key=rank_of, default=None)

    @property
    def verdict(self) -> str:
        """One line: the status word, then the most severe finding's title or what was read."""
        word = _VERDICTS[self.worst]
        if self.findings:
            counts = ", ".join(f"{n} {s}" for s in reversed(SEVERITIES)
                               if (n := sum(f.severity == s for f in self.findings)))
            return f"{word}: {self.findings[0].title} ({counts})"
        decode = self.stats.kinds.get("decode", 0)
        return f"{word}: no problems found in {self.stats.lines} lines ({decode} decode lines)"

    def fails(self, threshold: str) -> bool:
        """True when a finding is at least as severe as `threshold` (for `--fail-on`)."""
        return any(rank_of(f.severity) >= rank_of(threshold) for f in self.findings)


def _rows(paths: Sequence[str | Path], lines: Iterable[str] | None, stats: ParseStats,
          hot: list[HotBlock]) -> Iterator[list[Row]]:
    for i, path in enumerate(paths):
        yield from row_batches(path, i, stats, hot)
    if lines is not None:
        parser = Parser(len(paths), stats)
        batch: list[str] = []
        no = 1
        for line in lines:
            batch.append(line.rstrip("\r\n"))
            if len(batch) >= 8192:
                yield parser.feed(batch, no)
                no, batch = no + len(batch), []
        yield parser.feed(batch, no)
        yield parser.finish()


def analyze(
    paths: Sequence[str | Path] = (),
    *,
    lines: Iterable[str] | None = None,
    metrics: str | Metrics | None = None,
    bench: str | BenchInput | None = None,
    window: tuple[float, float] | None = None,
) -> Diagnosis:
    """Parse logs (`paths`: files, `.gz`, or `-` for stdin; and/or `lines`), build the timeline, run the rules.

    `window=(t0, t1)` keeps only time-series events inside it, in the log's clock (naive timestamps read
    as UTC; `diagnose.bench_input.to_log_clock` converts a unix time); start-up lines are always kept.
    `metrics` is a scrape file/URL (or parsed `Metrics`), `bench` a `toolkit bench` JSONL file.
    Raises `ValueError` for unreadable metrics/bench inputs and `OSError` for unreadable logs."""
    stats = ParseStats()
    hot: list[HotBlock] = []
    timeline = build_timeline(_rows(paths, lines, stats, hot), window, hot)
    scrape = read_metrics(metrics) if isinstance(metrics, str) else metrics
    run = read_bench(bench) if isinstance(bench, str) else bench
    ctx = Context(timeline, scrape, run)
    findings = sorted(run_rules(ctx), key=lambda f: -rank_of(f.severity))
    sources = [str(p) for p in paths] + (["<lines>"] if lines is not None else [])
    return Diagnosis(sources, stats, timeline, findings, ctx.notes,
                     launch_command(timeline.config.args, findings), scrape, run, window)
