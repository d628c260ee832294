"""Arrival schedules: absolute send offsets (seconds from the start of a run), fixed before the first request."""
from __future__ import annotations

import math
from typing import Literal

import numpy as np

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[str, ...] = ("poisson", "constant", "gamma")
_BATCH = 4096


def _gaps(rate: float, arrival: Arrival, burstiness: float, rng: np.random.Generator, n: int) -> np.ndarray:
    if arrival == "constant":
        return np.full(n, 1.0 / rate)
    shape = 1.0 if arrival == "poisson" else burstiness
    # NOTE: shape k and scale 1/(rate*k) keep the mean gap at 1/rate; the coefficient of variation is 1/sqrt(k).
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


def _offsets_from_gaps(gaps: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(gaps[:-1]))) if len(gaps) else np.zeros(0)


def schedule(
    rate: float,
    *,
    num_requests: int | None = None,
    duration: float | None = None,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
) -> np.ndarray:
    """Send offsets for `num_requests` requests, or for every arrival before `duration` seconds.

    The first request goes at 0. `rate=inf` sends everything at once. The same arguments give the same schedule.
    """
    if (num_requests is None) == (duration is None):
        raise ValueError("give exactly one of num_requests and duration")
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; choose one of {', '.join(ARRIVALS)}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        if num_requests is None:
            raise ValueError("--duration needs a finite --rate")
        return np.zeros(num_requests)
    if arrival == "constant":
        count = num_requests if num_requests is not None else math.ceil(duration * rate - 1e-9)
        return np.arange(count) / rate
    rng = np.random.default_rng(seed)
    if num_requests is not None:
        return _offsets_from_gaps(_gaps(rate, arrival, burstiness, rng, num_requests))
    return _offsets_until(rate, arrival, burstiness, rng, duration)


def _offsets_until(rate: float, arrival: Arrival, burstiness: float, rng: np.random.Generator, duration: float):
    offsets = np.zeros(1)
    while offsets[-1] < duration:
        more = offsets[-1] + np.cumsum(_gaps(rate, arrival, burstiness, rng, _BATCH))
        offsets = np.concatenate((offsets, more))
    return offsets[offsets < duration]
