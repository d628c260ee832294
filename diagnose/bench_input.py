"""`--bench RESULT.jsonl`: `toolkit bench` records (one JSON object per run) as evidence; missing keys are fine."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _float(record: dict[str, Any], key: str) -> float | None:
    v = record.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def to_log_clock(unix: float) -> float:
    """A unix time on the clock of a log written in this machine's time zone (naive timestamps as UTC)."""
    return unix + time.localtime(unix).tm_gmtoff


def _int(record: dict[str, Any], key: str) -> int | None:
    v = _float(record, key)
    return int(v) if v is not None else None


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
    def from_record(cls, record: dict[str, Any]) -> BenchRun:
        flagged = record.get("client_bottleneck")
        verdict = record.get("client_verdict")
        return cls(
            request_rate=_float(record, "request_rate"),
            achieved_rate=_float(record, "achieved_rate"),
            send_lag_p99_ms=_float(record, "send_lag_p99_ms"),
            client_bottleneck=flagged if isinstance(flagged, bool) else None,
            completed=_int(record, "completed"),
            output_throughput=_float(record, "output_throughput"),
            mean_ttft_ms=_float(record, "mean_ttft_ms"),
            started_at=_float(record, "started_at"),
            ended_at=_float(record, "ended_at"),
            scheduled_rate=_float(record, "scheduled_rate"),
            dispatch_ratio=_float(record, "dispatch_ratio"),
            send_lag_p50_ms=_float(record, "send_lag_p50_ms"),
            num_requests=_int(record, "num_requests"),
            max_concurrency=_int(record, "max_concurrency"),
            client_verdict=verdict if isinstance(verdict, str) else None,
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


def read_bench(path: str) -> BenchInput:
    """Every JSON object line of `path`; raises `ValueError` when none can be read."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ValueError(f"cannot read bench results {path}: {exc}") from exc
    runs = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            runs.append(BenchRun.from_record(record))
    if not runs:
        raise ValueError(f"{path} holds no JSON records of a bench run")
    return BenchInput(path, tuple(runs))
