"""A run's workload: the prompts and their absolute send offsets, fixed before the first request goes out."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.bench.arrivals import Arrival, schedule
from toolkit.bench.datasets import DatasetSpec, Prompt, build_prompts
from toolkit.bench.datasets.trace import prompts_for, read_trace, window


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """How requests arrive. `rate=None` replays a trace's own timestamps (and means `inf` for other datasets)."""

    rate: float | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration: float | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[Prompt]
    offsets: np.ndarray
    request_rate: float
    arrival: str

    def __len__(self) -> int:
        return len(self.prompts)


def _trace_replay(dataset: DatasetSpec, tokenizer, load: LoadSpec) -> Workload:
    trace = window(read_trace(dataset.path, dataset.trace_time_scale), load.num_prompts, load.duration)
    span = float(trace.offsets[-1]) if len(trace.offsets) else 0.0
    rate = (len(trace.offsets) - 1) / span if span > 0 else math.inf
    return Workload(prompts_for(trace, tokenizer, dataset.seed), trace.offsets, rate, "trace")


def build_workload(dataset: DatasetSpec, tokenizer, load: LoadSpec) -> Workload:
    if dataset.name == "trace" and load.rate is None:
        return _trace_replay(dataset, tokenizer, load)
    rate = math.inf if load.rate is None else load.rate
    shape = dict(arrival=load.arrival, burstiness=load.burstiness, seed=load.seed)
    if load.duration is not None:
        offsets = schedule(rate, duration=load.duration, **shape)
        prompts = build_prompts(dataset, tokenizer, len(offsets))
    else:
        prompts = build_prompts(dataset, tokenizer, load.num_prompts)
        offsets = schedule(rate, num_requests=len(prompts), **shape)
    return Workload(prompts, offsets, rate, load.arrival)
