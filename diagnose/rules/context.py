"""What every rule reads: the timeline, the server config, the optional scrape and bench run; and where a
rule says it could not judge (the verdict lists those, so "OK" is said only when the rules ran)."""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from toolkit.diagnose.bench_input import BenchInput
from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import Current
from toolkit.diagnose.metrics_input import Metrics
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.messages import BATCH_KINDS, CAPTURE_BEGAN
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.timeline import Timeline
from toolkit.diagnose.vocabulary import Change

MIN_LINES = 10  # fewer steady load lines than this and load-shape rules cannot judge
# NOTE: an OOM line and a traceback this few lines apart are one failure (one raised the other, or another worker
# printed its traceback of it): `crashes` and `oom` read them so
SAME_FAILURE_LINES = 10


@dataclass(slots=True)
class Context:
    timeline: Timeline
    metrics: Metrics | None = None
    bench: BenchInput | None = None
    notes: list[str] = field(default_factory=list)
    unjudged: list[tuple[str, str]] = field(default_factory=list)  # (rule, why it could not judge)
    rule: str = ""

    @property
    def config(self) -> ServerConfig:
        return self.timeline.config

    @property
    def load_word(self) -> str:
        return "stats" if self.timeline.load_kind == "stats" else "decode"

    def steady(self) -> Rows:
        return self.timeline.steady()

    def for_rule(self, rule: str) -> Context:
        """A context for one rule: the same inputs, its own notes and list of what it could not judge."""
        return Context(self.timeline, self.metrics, self.bench, rule=rule)

    def cannot_judge(self, why: str) -> None:
        self.unjudged.append((self.rule, why))

    def steady_enough(self, minimum: int = MIN_LINES) -> Rows | None:
        """The steady load lines, or None (noted as not judged) when there are fewer than `minimum`."""
        steady = self.steady()
        if len(steady) >= minimum:
            return steady
        total = len(self.timeline.load())
        self.cannot_judge(f"{len(steady)} steady {self.load_word} lines of {total} (needs {minimum})")
        return None

    def load_or_none(self) -> Rows | None:
        """Every load line (a short excerpt's, steady or not), None when there are none."""
        load = self.timeline.load()
        return load if len(load) else None

    def retraction_rate(self) -> tuple[int, float | None, str]:
        """(retractions, worst per-rank rate per busy minute or None without timestamps, that rank)."""
        from toolkit.diagnose.rules.retraction import per_rank_rates

        rates = per_rank_rates(self)
        count = sum(n for n, _ in rates.values())
        timed = [(rate, rank) for rank, (_, rate) in rates.items() if rate is not None]
        if not timed:
            return count, None, ""
        rate, rank = max(timed)
        return count, rate, rank


def pow2_at_least(n: float, cap: int) -> int:
    """The smallest power of two >= n, at most `cap`."""
    return int(min(cap, 2 ** int(np.ceil(np.log2(max(n, 1.0))))))


def power_of_two(values: np.ndarray) -> np.ndarray:
    """Which values are a power of two (whole and positive): prefill batches cut at a chunk are so sized."""
    whole = values.astype(np.int64)
    return (whole == values) & (whole > 0) & ((whole & (whole - 1)) == 0)


def pow2_at_most(n: float) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


def first_load_after(ctx: Context, line: int, source: int) -> int | None:
    """The line of the first load line (decode, prefill or stats) of `source` after `line`: where the server ran
    again; None when it did not (in the log)."""
    first = None
    for kind in BATCH_KINDS:
        rows = ctx.timeline.series(kind)
        if len(rows):
            later = rows["line"][(rows["line"] > line) & (rows["source"] == source)]
            if len(later):
                first = int(later.min()) if first is None else min(first, int(later.min()))
    return first


def no_cache_rows(ctx: Context) -> list[Event]:
    """vLLM start-up lines that show no room for any KV cache: 0 GPU blocks, a KV cache memory <= 0 GiB."""
    tl = ctx.timeline
    blocks = [e for e in tl.kind("gpu_blocks")
              if e.fields.get("device") != "cpu" and e.fields.get("device_blocks") == 0]
    memory = [e for kind in ("kv_memory", "memory_profile") for e in tl.kind(kind)
              if isinstance(gb := e.fields.get("kv_cache_gb"), float) and gb <= 0]
    return sorted(blocks + memory, key=lambda e: e.line)


def capturing_at(ctx: Context, e: Event) -> bool:
    """Whether CUDA graphs were being captured when `e` was printed: the last capture line of its source before it
    is a `Capture cuda graph begin` or a capture's progress bar (its end not printed), and the server ran no batch
    since."""
    marks = [x for kind in (*CAPTURE_BEGAN, "graph_end") for x in ctx.timeline.kind(kind)
             if x.source == e.source and x.line < e.line]
    last = max(marks, key=attrgetter("line")) if marks else None
    if last is None or last.kind == "graph_end":
        return False
    ran = first_load_after(ctx, last.line, e.source)
    return ran is None or ran > e.line


MAX_FRACTION = 0.95  # the highest static memory fraction the rules advise (activations and graphs need the rest)
STEP = 0.05


def memory_fraction(config: ServerConfig) -> Current | None:
    """The static memory fraction (SGLang's `--mem-fraction-static`, vLLM's `--gpu-memory-utilization`): the log's,
    else the engine's default (said so); None where neither is known."""
    value = config.mem_fraction_static
    if value is not None:
        return Current.of(value)
    default = config.knob("kv_memory").default  # type: ignore[union-attr]
    return Current.of(float(default), "default") if isinstance(default, (int, float)) else None


def more_kv_memory(config: ServerConfig) -> Change | None:
    """The static memory fraction STEP higher, at most MAX_FRACTION; None where the log's is there already (more KV
    memory is not on offer: ask for fewer requests at once instead)."""
    now = memory_fraction(config)
    if now is None:
        return Change("kv_memory", direction=1)
    if now.value >= MAX_FRACTION:  # type: ignore[operator]
        return None
    return Change("kv_memory", f"{min(MAX_FRACTION, now.value + STEP):.2f}")  # type: ignore[operator]
