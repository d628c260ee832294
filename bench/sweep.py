"""Several rates in one command: a given list, or `--sweep` (saturation first, then fractions of it).

A run at a finite rate is past saturation when the server fell behind for good within it: the TTFT p50 of its last
time slice is over `TTFT_GROWTH` times its first slice's, and the server completed under `RATE_SHORTFALL` of the
scheduled rate over the steady window (over the whole run when it has none). Then the remaining rates at or above
it are skipped (`stopped_early` on that run's record), unless early stopping is off.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from toolkit.bench.pareto import pareto_record
from toolkit.bench.stats import metric

SWEEP_FRACTIONS = (0.25, 0.5, 0.75, 0.9)
TTFT_GROWTH = 3.0
RATE_SHORTFALL = 0.9


@dataclass(frozen=True, slots=True)
class Step:
    rate: float | None
    role: Literal["single", "rate", "saturation", "probe"]
    index: int = 0


def _round(rate: float) -> float:
    return float(f"{rate:.3g}")


def rates_below(saturation: float) -> list[float]:
    """Rates at fixed fractions of the measured saturation throughput, ascending and distinct."""
    return sorted({_round(saturation * f) for f in SWEEP_FRACTIONS if saturation * f > 0})


def past_saturation(record: dict) -> str | None:
    """Why the run shows the server past saturation, or None when it does not (or cannot tell)."""
    ttfts = [s["ttft_p50_ms"] for s in record.get("slices") or [] if s.get("ttft_p50_ms") is not None]
    scheduled = record.get("scheduled_rate")
    completed = (record.get("steady") or {}).get("request_throughput", record.get("request_throughput"))
    if len(ttfts) < 2 or not scheduled or completed is None:
        return None
    if ttfts[-1] > TTFT_GROWTH * ttfts[0] and completed < RATE_SHORTFALL * scheduled:
        return (f"TTFT p50 grew from {ttfts[0]:.0f} ms in the first time slice to {ttfts[-1]:.0f} ms in the last, "
                f"and the server completed {completed:.2f} req/s of the {scheduled:.2f} req/s scheduled")
    return None


def _rates_below_saturation(record: dict, index: int) -> list[Step]:
    saturation = metric(record, "request_throughput") or 0.0
    if record.get("interrupted") or not saturation > 0:
        return []
    return [Step(rate, "rate", i) for i, rate in enumerate(rates_below(saturation), index + 1)]


def _stop_if_saturated(record: dict, step: Step, remaining: list[Step]) -> list[Step]:
    reason = past_saturation(record)
    skipped = [s for s in remaining if reason and s.rate is not None and s.rate >= step.rate]
    if skipped:
        record["stopped_early"] = {"rate": step.rate, "reason": reason, "skipped": [s.rate for s in skipped]}
    return [s for s in remaining if s not in skipped]


def sweep(measure: Callable[[Step], dict], rates: list[float] | None, find_saturation: bool,
          emit: Callable[[dict], object] | None = None, stop_past_saturation: bool = True) -> list[dict]:
    """Runs the steps in order, hands each record to `emit` once it is final, and returns them.

    With `find_saturation`, the first run sends everything at once (`rate=inf`) and its request throughput is the
    saturation point; the following runs use rates below it. The command stops at an interrupted run, and (with
    `stop_past_saturation`) skips the rates at or above a run past saturation. When several runs were made, the
    last record carries the `pareto` front of them all.
    """
    if find_saturation:
        steps = [Step(math.inf, "saturation", 0)]
    else:
        plan = rates or [None]
        steps = [Step(rate, "rate" if len(plan) > 1 else "single", i) for i, rate in enumerate(plan)]
    records: list[dict] = []
    while steps:
        step, steps = steps[0], steps[1:]
        record = measure(step)
        records.append(record)
        if step.role == "saturation":
            steps = _rates_below_saturation(record, step.index)
        elif stop_past_saturation and step.role == "rate":
            steps = _stop_if_saturated(record, step, steps)
        if record.get("interrupted"):
            steps = []
        if not steps and len(records) > 1:
            record["pareto"] = pareto_record(records)
        if emit is not None:
            emit(record)
    return records
