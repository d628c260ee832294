"""What `tune` maximizes, read from bench records, and the noise test that decides whether a change helped.

Objectives (all higher-is-better):
- `throughput`: output tokens/s of the run (`output_throughput`);
- `goodput`: requests/s that met every `--slo` bound (`goodput`);
- `max-rate`: the highest request rate whose run meets the SLOs (`bench --find-max-rate`'s answer; 0 when no rate did).

Noise rule: each configuration runs R times; its mean and spread are `toolkit bench --repeats`'s statistics
(`bench.stats`, with the 95 % interval the tune page shows). A candidate beats the current best only when its mean gain exceeds
both `k` pooled standard errors, `k * s_pooled * sqrt(1/n_best + 1/n_candidate)` (a two-sample t-style test;
`s_pooled` is the pooled sample standard deviation of the two sets of repeats), and a minimum relative margin,
`min_gain * |mean_best|`, so that two lucky, tight repeats cannot pass off a 1% wiggle as a gain. With a single
repeat on both sides there is no spread to pool and only the relative margin applies.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from toolkit.bench.stats import Interval, mean_interval

Objective = Literal["throughput", "goodput", "max-rate"]
OBJECTIVES: tuple[str, ...] = ("throughput", "goodput", "max-rate")
UNITS = {"throughput": "tok/s", "goodput": "req/s", "max-rate": "req/s"}
RECORD_KEYS = {"throughput": "output_throughput", "goodput": "goodput"}


def needs_slo(objective: str) -> bool:
    return objective in ("goodput", "max-rate")


def value_of(objective: str, record: dict) -> float:
    """The objective of one `throughput` / `goodput` run record (0 when the run measured nothing)."""
    value = record.get(RECORD_KEYS[objective])
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


@dataclass(frozen=True, slots=True)
class Sample:
    """The objective over a configuration's repeats."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def interval(self) -> Interval | None:
        """The mean with its Student-t 95 % interval: the statistics `toolkit bench --repeats` reports."""
        return mean_interval(self.values)

    @property
    def mean(self) -> float:
        interval = self.interval
        return interval.mean if interval is not None else math.nan

    @property
    def spread(self) -> float:
        """Sample standard deviation (0 for a single repeat)."""
        interval = self.interval
        return interval.std if interval is not None and interval.std is not None else 0.0


@dataclass(frozen=True, slots=True)
class NoiseRule:
    k: float = 2.0
    min_gain: float = 0.03


class Comparison(NamedTuple):
    delta: float  # candidate mean - best mean
    relative: float  # delta / |best mean|
    threshold: float  # the gain needed to count
    better: bool


def pooled_sd(a: Sample, b: Sample) -> float:
    dof = a.n + b.n - 2
    if dof <= 0:
        return 0.0
    return math.sqrt(((a.n - 1) * a.spread ** 2 + (b.n - 1) * b.spread ** 2) / dof)


def compare(best: Sample, candidate: Sample, rule: NoiseRule = NoiseRule()) -> Comparison:
    delta = candidate.mean - best.mean
    scale = abs(best.mean)
    noise = rule.k * pooled_sd(best, candidate) * math.sqrt(1 / best.n + 1 / candidate.n)
    threshold = max(noise, rule.min_gain * scale)
    relative = delta / scale if scale > 0 else (math.inf if delta > 0 else 0.0)
    return Comparison(delta, relative, threshold, delta > threshold)


def sample_of(values: Sequence[float]) -> Sample:
    return Sample(tuple(float(v) for v in values))
