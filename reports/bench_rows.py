"""Bench records as report rows: the run configuration, the client verdict, and the per-rate tables."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIG_KEYS: tuple[tuple[str, str], ...] = (
    ("tool", "tool"), ("version", "version"), ("backend", "backend"), ("server", "base_url"), ("model", "model"),
    ("tokenizer", "tokenizer"), ("dataset", "dataset_name"), ("dataset file", "dataset_path"),
    ("input tokens (at most)", "random_input_len"), ("output tokens (at most)", "random_output_len"),
    ("length range ratio", "random_range_ratio"), ("arrival", "arrival"), ("burstiness", "burstiness"),
    ("max concurrency", "max_concurrency"), ("seed", "seed"), ("warm-up requests", "warmup_requests"),
    ("request timeout (s)", "request_timeout"), ("ignore EOS", "ignore_eos"), ("SLOs (ms)", "slo"),
    ("server log", "server_log"),
)
LATENCIES: tuple[tuple[str, str], ...] = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2e_latency"))
MAX_FAILED_ROWS = 20


@dataclass(frozen=True, slots=True)
class Run:
    """One record with its position in the input (`number`, from 1) and its asked rate (inf for "all at once")."""

    number: int
    rate: float
    record: dict

    @property
    def rate_label(self) -> str:
        if math.isinf(self.rate):
            return "inf"
        return "?" if math.isnan(self.rate) else f"{self.rate:g}"

    def get(self, key: str) -> object:
        return self.record.get(key)


def _rate(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.inf if str(value).lower() in ("inf", "infinity") else math.nan


def runs(records: Sequence[dict]) -> list[Run]:
    """Records in ascending rate order (inf last, unknown rates after it); equal rates keep their input order."""
    out = [Run(i, _rate(r.get("request_rate")), r) for i, r in enumerate(records, 1)]
    return sorted(out, key=lambda r: (math.isnan(r.rate), r.rate if not math.isnan(r.rate) else 0.0, r.number))


def _show(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)


def config_rows(records: Sequence[dict]) -> list[tuple[str, str]]:
    """(label, value) for each configuration key any record has; values that differ between runs are listed."""
    rows = []
    for label, key in CONFIG_KEYS:
        values = list(dict.fromkeys(_show(r.get(key)) for r in records if key in r))
        if values:
            rows.append((label, values[0] if len(values) == 1 else "varies: " + " | ".join(values)))
    span = window_text(records)
    if span:
        rows.append(("time window", span))
    rows.append(("runs", str(len(records))))
    return rows


def window_text(records: Sequence[dict]) -> str | None:
    starts = [r["started_at_iso"] for r in records if isinstance(r.get("started_at_iso"), str)]
    ends = [r["ended_at_iso"] for r in records if isinstance(r.get("ended_at_iso"), str)]
    return f"{min(starts)} to {max(ends)}" if starts and ends else None


def bottlenecked(rows: Sequence[Run]) -> list[Run]:
    return [r for r in rows if r.get("client_bottleneck") is True]


def verdict_summary(rows: Sequence[Run]) -> str:
    slow = bottlenecked(rows)
    if not slow:
        return f"The client kept up in {'the run' if len(rows) == 1 else f'all {len(rows)} runs'}."
    rates = ", ".join(r.rate_label for r in slow)
    return (f"The client was the bottleneck in {len(slow)} of {len(rows)} runs (rate {rates} req/s): the server "
            "saw less load than asked, so those rows understate what it can do.")


def failed_rows(rows: Sequence[Run]) -> list[dict]:
    """The first failed requests (with `--output-details`): run, rate, request index, error kind and message."""
    out = []
    for run in rows:
        for req in run.get("requests") or []:
            if isinstance(req, dict) and req.get("error"):
                out.append({"run": run.number, "rate": run.rate_label, "index": req.get("index"),
                            "error": req.get("error"), "message": req.get("message") or ""})
    return out[:MAX_FAILED_ROWS]


def errors_text(record: dict) -> str:
    errors = record.get("errors")
    return ", ".join(f"{k} ×{v}" for k, v in errors.items()) if isinstance(errors, dict) and errors else ""
