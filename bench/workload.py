"""A run's workload: the prompts and their absolute send offsets, fixed before the first request goes out."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.bench.arrivals import Arrival, schedule
from toolkit.bench.conversation import Session, sessions_of
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
    turns: int = 1  # > 1: each arrival starts a chat session of this many turns
    think_time: float = 0.0  # seconds between a turn's reply and the session's next turn


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[Prompt]
    offsets: np.ndarray
    request_rate: float  # arrivals per second: requests, or sessions when turns > 1
    arrival: str
    turns: int = 1
    think_time: float = 0.0

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def sessions(self) -> list[Session]:
        return sessions_of(self.prompts, self.turns)


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
    turns = load.turns
    if load.duration is not None:
        offsets = schedule(rate, duration=load.duration, **shape)
        prompts = build_prompts(dataset, tokenizer, len(offsets) * turns)
    else:
        prompts = build_prompts(dataset, tokenizer, None if load.num_prompts is None else load.num_prompts * turns)
        offsets = schedule(rate, num_requests=len(prompts) // turns, **shape)
    return Workload(prompts[: len(offsets) * turns], offsets, rate, load.arrival, turns, load.think_time)
