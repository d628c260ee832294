"""The Pareto front of a sweep: the runs no other run beats on both the speed one user sees and the total output.

A run's per-user speed is `1000 / mean_tpot_ms` (output tok/s of one stream once it has started); its total is
`output_throughput`. With `--repeats`, a configuration counts once, at the means over its repeats (pure).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from toolkit.bench.stats import metric

PER_USER_LABEL = "output tok/s per user"
TOTAL_LABEL = "total output tok/s"


@dataclass(frozen=True, slots=True)
class Point:
    request_rate: float | str | None
    per_user_output_throughput: float
    output_throughput: float


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def configurations(records: Sequence[dict]) -> list[dict]:
    """One record per configuration: a repeat that is not the one summarising its configuration is left out."""
    return [r for r in records if "repeat" not in r or "repeats" in r]


def point(record: dict) -> Point | None:
    tpot, total = _number(metric(record, "mean_tpot_ms")), _number(metric(record, "output_throughput"))
    if tpot is None or total is None or not tpot > 0:
        return None
    return Point(record.get("request_rate"), 1000.0 / tpot, total)


def points(records: Sequence[dict]) -> list[Point]:
    return [p for p in map(point, configurations(records)) if p is not None]


def front(candidates: Sequence[Point]) -> list[Point]:
    """The points no other point matches or beats on both axes, fastest per user first."""
    ordered = sorted(candidates, key=lambda p: (-p.per_user_output_throughput, -p.output_throughput))
    kept: list[Point] = []
    for p in ordered:
        if not kept or p.output_throughput > kept[-1].output_throughput:
            kept.append(p)
    return kept


def pareto_record(records: Sequence[dict]) -> dict:
    """The `pareto` block of a sweep's last record."""
    runs = points(records)
    return {"x": "per_user_output_throughput", "y": "output_throughput", "points": len(runs),
            "front": [asdict(p) for p in front(runs)]}
