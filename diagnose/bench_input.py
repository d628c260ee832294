"""`--bench RESULT.jsonl`: `toolkit bench` records (one JSON object per run, read by `bench.record`) as evidence;
missing keys are fine, and lines that are not a bench record are skipped."""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.bench.record import BenchRecord, RecordError, read_records


def to_log_clock(unix: float) -> float:
    """A unix time on the clock of a log written in this machine's time zone (naive timestamps as UTC)."""
    return unix + time.localtime(unix).tm_gmtoff


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One run. The client-verdict fields (`scheduled_rate` ... `client_verdict`) are `toolkit bench`'s own
    judgement of its send schedule; `client_bottleneck` is None when the record does not carry it (other tools)."""

    request_rate: float | None = None
    achieved_rate: float | None = None
    send_lag_p99_ms: float | None = None
    client_bottleneck: bool | None = None
    completed: int | None = None
    output_throughput: float | None = None
    mean_ttft_ms: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    scheduled_rate: float | None = None
    dispatch_ratio: float | None = None
    send_lag_p50_ms: float | None = None
    num_requests: int | None = None
    max_concurrency: int | None = None
    client_verdict: str | None = None

    @classmethod
    def from_record(cls, record: BenchRecord | Mapping[str, Any]) -> BenchRun:
        """Raises ValueError when `record` (a parsed JSON object) is not a bench record."""
        r = record if isinstance(record, BenchRecord) else BenchRecord.from_json(dict(record))
        return cls(
            request_rate=None if isinstance(r.request_rate, str) else _float(r.request_rate),  # "inf": no rate
            achieved_rate=_float(r.achieved_rate),
            send_lag_p99_ms=_float(r.send_lag_p99_ms),
            client_bottleneck=r.client_bottleneck,
            completed=r.completed,
            output_throughput=_float(r.output_throughput),
            mean_ttft_ms=_float(r.mean_ttft_ms),
            started_at=_float(r.started_at),
            ended_at=_float(r.ended_at),
            scheduled_rate=_float(r.scheduled_rate),
            dispatch_ratio=_float(r.dispatch_ratio),
            send_lag_p50_ms=_float(r.send_lag_p50_ms),
            num_requests=r.num_requests,
            max_concurrency=r.max_concurrency,
            client_verdict=r.client_verdict,
        )

    @property
    def has_verdict(self) -> bool:
        return self.client_bottleneck is not None

    def facts(self) -> dict[str, float | int | str | None]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class BenchInput:
    source: str
    runs: tuple[BenchRun, ...] = field(default_factory=tuple)
    skipped: int = 0  # lines of the file that were not a bench record


def read_bench(path: str) -> BenchInput:
    """Every bench record of `path`; raises `ValueError` when none can be read."""
    try:
        read = read_records(path, strict=False)
    except RecordError as exc:
        raise ValueError(f"cannot read bench results: {exc}") from exc
    if not read.records:
        raise ValueError(f"{path} holds no JSON records of a bench run")
    return BenchInput(path, tuple(BenchRun.from_record(r) for r in read.records), skipped=read.skipped)


def _float(value: float | None) -> float | None:
    """A JSON integer as a float (the record's number keys accept both)."""
    return None if value is None else float(value)
