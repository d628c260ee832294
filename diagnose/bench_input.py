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


@dataclass(frozen=True, slots=True)
class BenchRun:
    request_rate: float | None = None
    achieved_rate: float | None = None
    send_lag_p99_ms: float | None = None
    client_bottleneck: bool = False
    completed: int | None = None
    output_throughput: float | None = None
    mean_ttft_ms: float | None = None
    started_at: float | None = None
    ended_at: float | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BenchRun:
        completed = record.get("completed")
        return cls(
            request_rate=_float(record, "request_rate"),
            achieved_rate=_float(record, "achieved_rate"),
            send_lag_p99_ms=_float(record, "send_lag_p99_ms"),
            client_bottleneck=bool(record.get("client_bottleneck", False)),
            completed=int(completed) if isinstance(completed, (int, float)) else None,
            output_throughput=_float(record, "output_throughput"),
            mean_ttft_ms=_float(record, "mean_ttft_ms"),
            started_at=_float(record, "started_at"),
            ended_at=_float(record, "ended_at"),
        )

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
