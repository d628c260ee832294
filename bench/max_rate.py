"""`--find-max-rate`: the highest request rate whose run meets every `--slo` bound (pure; the runs are a callback).

A run meets the SLOs when at least `attainment` of its sent requests met every bound (DistServe's SLO attainment;
failed requests count against it). The search starts from a first guess (the saturation throughput, or `--rate`),
doubles the rate while runs pass (halves it while they fail) until a passing and a failing rate bracket the
answer, then bisects geometrically until the bracket is narrow (`hi / lo - 1 <= tolerance`, one bisection step)
or `max_runs` runs are spent. The answer is the highest rate that passed.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_ATTAINMENT = 0.9
DEFAULT_RUNS = 8
TOLERANCE = 0.1
GROWTH = 2.0


@dataclass(frozen=True, slots=True)
class SearchSettings:
    max_runs: int = DEFAULT_RUNS
    tolerance: float = TOLERANCE
    growth: float = GROWTH


@dataclass(slots=True)
class Bracket:
    """`lo`: the highest rate that met the SLOs; `hi`: the lowest that did not; `probes`: (rate, met) in order."""

    lo: float | None = None
    hi: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def add(self, rate: float, met: bool) -> None:
        self.probes.append((rate, met))
        if met and (self.lo is None or rate > self.lo):
            self.lo = rate
        if not met and (self.hi is None or rate < self.hi):
            self.hi = rate

    def narrow(self, tolerance: float) -> bool:
        return self.lo is not None and self.hi is not None and self.hi / self.lo - 1.0 <= tolerance

    def next_rate(self, growth: float) -> float:
        if self.lo is None:
            return self.hi / growth
        if self.hi is None:
            return self.lo * growth
        return math.sqrt(self.lo * self.hi)

    def as_record(self) -> dict:
        return {"max_rate": self.lo, "bracket_hi": self.hi, "probes": len(self.probes)}


def meets_slo(record: dict, attainment: float = DEFAULT_ATTAINMENT) -> bool:
    achieved = record.get("slo_attainment")
    return achieved is not None and record.get("completed", 0) > 0 and achieved >= attainment


def find_max_rate(probe: Callable[[float], bool | None], start: float, settings: SearchSettings = SearchSettings(),
                  on_result: Callable[[Bracket], None] | None = None) -> Bracket:
    """Runs `probe(rate)` (True: met the SLOs, False: did not, None: stop now) at most `settings.max_runs` times;
    `on_result` sees the bracket after each probe that gave an answer."""
    if not start > 0 or not math.isfinite(start):
        raise ValueError(f"the search needs a positive, finite first rate, got {start}")
    bracket, rate = Bracket(), start
    for _ in range(settings.max_runs):
        met = probe(rate)
        if met is None:
            break
        bracket.add(rate, met)
        if on_result is not None:
            on_result(bracket)
        if bracket.narrow(settings.tolerance):
            break
        rate = bracket.next_rate(settings.growth)
    return bracket
