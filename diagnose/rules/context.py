"""What every rule reads: the timeline, the server config, and the optional scrape and bench run."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from toolkit.diagnose.bench_input import BenchInput
from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.metrics_input import Metrics
from toolkit.diagnose.timeline import Timeline

MIN_LINES = 10  # fewer steady decode lines than this and load-shape rules stay silent


@dataclass(slots=True)
class Context:
    timeline: Timeline
    metrics: Metrics | None = None
    bench: BenchInput | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def config(self) -> ServerConfig:
        return self.timeline.config

    def steady(self) -> pd.DataFrame:
        return self.timeline.steady_decode()

    def retraction_rate(self) -> tuple[int, float | None, str]:
        """(retractions, worst per-rank rate per busy minute or None without timestamps, that rank)."""
        rows = self.timeline.kind("retract")
        best: tuple[int, float | None, str] = (len(rows), None, "")
        for rank in {r[3] for r in rows}:
            n = sum(1 for r in rows if r[3] == rank)
            busy = self.timeline.busy_seconds(rank) if rank in self.timeline.frames else None
            if busy is None and len(self.timeline.frames) == 1:
                busy = self.timeline.busy_seconds(next(iter(self.timeline.frames)))
            if busy:
                rate = n / max(busy / 60.0, 1.0)
                if best[1] is None or rate > best[1]:
                    best = (len(rows), rate, rank)
        return best


def pow2_at_least(n: float, cap: int) -> int:
    """The smallest power of two >= n, at most `cap`."""
    return int(min(cap, 2 ** int(np.ceil(np.log2(max(n, 1.0))))))


def ranks_of(rows: pd.DataFrame) -> tuple[str, ...]:
    return tuple(sorted(str(r) for r in pd.unique(rows["rank"]))) if "rank" in rows else ()
