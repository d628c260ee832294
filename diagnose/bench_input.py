"""`--bench RESULT.jsonl`: `toolkit bench` records (one JSON object per run, read by `bench.record` into its
`BenchRecord`s) as evidence; missing keys are fine, and lines that are not a bench record are skipped."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import get_args

from toolkit.bench.record import TYPED, BenchRecord, RecordError, read_records


def to_log_clock(unix: float) -> float:
    """A unix time on the clock of a log written in this machine's time zone (naive timestamps as UTC)."""
    return unix + time.localtime(unix).tm_gmtoff


# The facts of a run a diagnosis quotes, in this order: the client's verdict (`scheduled_rate` ... `client_verdict`:
# `toolkit bench`'s own judgement of its send schedule) and what the client rule reads
RUN_FACTS = ("request_rate", "achieved_rate", "send_lag_p99_ms", "client_bottleneck", "completed", "output_throughput",
             "mean_ttft_ms", "started_at", "ended_at", "scheduled_rate", "dispatch_ratio", "send_lag_p50_ms",
             "num_requests", "max_concurrency", "client_verdict")


def run_facts(record: BenchRecord) -> dict[str, float | int | str | None]:
    """A run's facts the diagnosis quotes (those the record gives): a number the record types as a float is one (a
    JSON integer too); the rate "inf" is no rate."""
    out: dict[str, float | int | str | None] = {}
    for key in RUN_FACTS:
        value = record.request_rate_number if key == "request_rate" else getattr(record, key)
        if value is not None:
            out[key] = float(value) if float in get_args(TYPED[key]) and not isinstance(value, bool) else value
    return out


@dataclass(frozen=True, slots=True)
class BenchInput:
    source: str
    runs: tuple[BenchRecord, ...] = field(default_factory=tuple)
    skipped: int = 0  # lines of the file that were not a bench record


def read_bench(path: str) -> BenchInput:
    """Every bench record of `path`; raises `ValueError` when none can be read."""
    try:
        read = read_records(path, strict=False)
    except RecordError as exc:
        raise ValueError(f"cannot read bench results: {exc}") from exc
    if not read.records:
        raise ValueError(f"{path} holds no JSON records of a bench run")
    return BenchInput(path, tuple(read.records), skipped=read.skipped)
