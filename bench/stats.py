"""Means with Student-t 95 % confidence intervals over repeated runs (pure, no scipy: it is not a runtime dependency).

One place for the statistics of repeats: `toolkit bench --repeats` summarises its runs with `repeat_summary`, and a
noise rule that compares two configurations can use `mean_interval` on the same numbers.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
# t_{0.975, df} for df = 1..30: the two-sided 95 % critical values of Student's t (scipy.stats.t.ppf, 4 decimals).
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959963984540054

# The metrics whose repeat-to-repeat spread a record reports; a dotted key reads a nested block (`steady`).
REPEAT_METRICS: tuple[str, ...] = (
    "request_throughput", "input_throughput", "output_throughput", "total_throughput", "concurrency",
    "goodput", "slo_attainment", "achieved_rate", "cache_hit_rate",
    *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2e_latency") for stat in ("mean", "median", "p99")),
    "steady.request_throughput", "steady.output_throughput", "steady.median_ttft_ms", "steady.p99_ttft_ms",
    "steady.median_itl_ms", "steady.p99_itl_ms",
)


def t_critical(df: int) -> float:
    """The two-sided 95 % critical value of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"Student's t needs at least one degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    # NOTE: the Cornish-Fisher expansion in 1/df; beyond 30 degrees of freedom it is within 2e-6 of the exact value.
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True, slots=True)
class Interval:
    """A sample mean and its 95 % confidence interval; the bounds, `half_width` and `std` are None for one value."""

    mean: float
    n: int
    std: float | None = None
    half_width: float | None = None

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def as_record(self) -> dict:
        return {"mean": self.mean, "ci_low": self.low, "ci_high": self.high, "half_width": self.half_width,
                "std": self.std, "n": self.n}


def _finite(values: Sequence[object]) -> list[float]:
    numbers = (v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    return [float(v) for v in numbers if math.isfinite(v)]


def mean_interval(values: Sequence[object]) -> Interval | None:
    """The mean of the finite numbers in `values` with its Student-t 95 % interval; None when there are none."""
    xs = _finite(values)
    if not xs:
        return None
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return Interval(mean, 1)
    std = statistics.stdev(xs)
    return Interval(mean, len(xs), std, t_critical(len(xs) - 1) * std / math.sqrt(len(xs)))


def value_at(record: dict, key: str) -> object:
    """`record[key]`, where a dotted key reads a nested block (`steady.output_throughput`); None when absent."""
    value: object = record
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def repeat_summary(records: Sequence[dict], keys: Sequence[str] = REPEAT_METRICS) -> dict:
    """`repeats` of a configuration's record: its seeds and, per metric any repeat measured, the mean and 95 % CI."""
    intervals = {key: mean_interval([value_at(r, key) for r in records]) for key in keys}
    return {"count": len(records), "seeds": [r.get("seed") for r in records], "confidence": CONFIDENCE,
            "metrics": {key: i.as_record() for key, i in intervals.items() if i is not None}}


def metric(record: dict, key: str) -> object:
    """A configuration's value of `key`: the mean over its repeats where the record summarises them, else its own."""
    summary = (record.get("repeats") or {}).get("metrics", {}).get(key) or {}
    return summary["mean"] if summary.get("mean") is not None else value_at(record, key)
