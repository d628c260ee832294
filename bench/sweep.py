"""Several rates in one command: a given list, or `--sweep` (saturation first, then fractions of it)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

SWEEP_FRACTIONS = (0.25, 0.5, 0.75, 0.9)


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


def sweep(measure: Callable[[Step], dict], rates: list[float] | None, find_saturation: bool) -> list[dict]:
    """Runs the steps in order and returns their records; stops early when a run was interrupted.

    With `find_saturation`, the first run sends everything at once (`rate=inf`) and its request throughput is the
    saturation point; the following runs use rates below it.
    """
    if find_saturation:
        first = measure(Step(math.inf, "saturation", 0))
        saturation = first.get("request_throughput") or 0.0
        if first.get("interrupted") or not saturation > 0:
            return [first]
        steps = [Step(rate, "rate", i) for i, rate in enumerate(rates_below(saturation), 1)]
        records = [first]
    else:
        plan = rates or [None]
        steps = [Step(rate, "rate" if len(plan) > 1 else "single", i) for i, rate in enumerate(plan)]
        records = []
    for step in steps:
        records.append(measure(step))
        if records[-1].get("interrupted"):
            break
    return records
