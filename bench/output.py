"""Run records: the summary table on the terminal and one JSON line per run in `--output-file`.

Record schema (one JSON object per run; numbers that could not be measured are null):
- run configuration: `tool`, `version`, `backend`, `base_url`, `model`, `tokenizer`, `dataset_name`,
  `dataset_path`, `random_input_len`, `random_output_len`, `random_range_ratio`, `request_rate` (req/s, or the
  string "inf"), `arrival` (poisson|constant|gamma|trace), `burstiness`, `max_concurrency`, `seed`,
  `warmup_requests`, `warmup_failures`, `request_timeout`, `ignore_eos`,
  `sweep` ({"role": "saturation"|"rate", "step": i}, only when a command runs several rates);
  `search` (only with `--find-max-rate`: {"role": "saturation"|"probe", "step": i, "meets_slo": bool, and after
  each answered probe the bracket so far: "max_rate" (highest passing rate or null), "bracket_hi" (lowest failing
  rate or null), "probes"});
- SGLang bench_serving names: `duration` (s, first send to last response), `completed`, `total_input_tokens`,
  `total_output_tokens`, `request_throughput`, `input_throughput`, `output_throughput`, `total_throughput`,
  `concurrency` (mean requests in flight), and for each of ttft, tpot, itl and e2e_latency the keys
  `mean_X_ms`, `median_X_ms`, `p90_X_ms`, `p99_X_ms`, `std_X_ms`, `max_X_ms`;
- outcome counts: `num_requests` (sent), `failed`, `cancelled` (stopped by Ctrl-C), `errors` ({kind: count}, kinds
  `http_<status>`, `timeout`, `connection`, `malformed_response`, `server_error`, `empty_response`), `interrupted`;
- goodput (with `--slo`): `slo` ({"ttft"|"tpot"|"e2e": ms}), `goodput` (req/s meeting every SLO),
  `slo_attainment` (fraction of sent requests meeting every SLO);
- client verdict: `scheduled_rate`, `achieved_rate` (req/s as sent), `dispatch_ratio`, `send_lag_p50_ms`,
  `send_lag_p99_ms`, `send_lag_max_ms`, `concurrency_wait_p99_ms`, `send_lag_limit_ms` (the lag past which
  the client counts as the bottleneck: 10 ms, or a tenth of the mean scheduled gap when longer),
  `client_bottleneck`, `client_verdict`;
- the window, for cutting server logs: `started_at`, `ended_at` (unix seconds), `started_at_iso`, `ended_at_iso`
  (local time with offset), `server_log` (the `--server-log` path or null);
- server side: `scraped_metrics` ([{"t": unix seconds, "metrics": {sample name: value}}]), `scrape_error`;
- `requests` (only with `--output-details`): one row per request with `index`, `scheduled_ms`, `send_lag_ms`,
  `sent_at`, `input_len`, `output_len`, `ttft_ms`, `tpot_ms`, `e2e_ms`, `itl_ms` (list), `error`, `message`, `text`.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolkit.bench.metrics import request_metrics
from toolkit.bench.outcome import RequestOutcome
from toolkit.bench.runner import RunResult


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix).astimezone().isoformat(timespec="milliseconds")


def window(run: RunResult, server_log: str | None) -> dict:
    return {
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "started_at_iso": _iso(run.started_at),
        "ended_at_iso": _iso(run.ended_at),
        "interrupted": run.interrupted,
        "server_log": server_log,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def request_row(out: RequestOutcome, run: RunResult) -> dict:
    row = {
        "index": out.index,
        "scheduled_ms": out.scheduled * 1000.0,
        "send_lag_ms": (out.dispatched - run.start - out.scheduled) * 1000.0 if out.dispatched else None,
        "sent_at": run.started_at + (out.sent - run.start) if out.sent else None,
        "input_len": out.input_len,
        "output_len": out.output_len,
        "error": out.error,
        "message": out.message or None,
        "text": out.text,
    }
    if out.ok:
        m = request_metrics(out)
        row |= {"ttft_ms": _ms(m.ttft), "tpot_ms": _ms(m.tpot), "e2e_ms": _ms(m.e2e),
                "itl_ms": [round(g * 1000.0, 4) for g in m.itls]}
    return row


def clean(value):
    """JSON-safe: NaN and infinities become null (the one deliberate "inf" is a string)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(clean(record)) + "\n")


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def summary_table(record: dict) -> Table:
    rate = record["request_rate"]
    title = f"toolkit bench · {record['backend']} · {record['dataset_name']} · rate {rate}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("Requests completed / sent", f"{record['completed']} / {record['num_requests']}"),
        ("Failed", escape(f"{record['failed']}  {record['errors'] or ''}".rstrip())),
        ("Duration (s)", _fmt(record["duration"])),
        ("Request throughput (req/s)", _fmt(record["request_throughput"])),
        ("Input / output throughput (tok/s)",
         f"{_fmt(record['input_throughput'], 1)} / {_fmt(record['output_throughput'], 1)}"),
        ("Mean concurrency", _fmt(record["concurrency"])),
    ]
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e_latency", "E2E")):
        stats = "  ".join(f"{s} {_fmt(record[f'{s}_{name}_ms'])}" for s in ("mean", "median", "p90", "p99", "max"))
        rows.append((f"{label} (ms)", stats))
    if "goodput" in record:
        rows.append(("Goodput (req/s) / SLO attainment",
                     f"{_fmt(record['goodput'])} / {_fmt(record['slo_attainment'], 3)}"))
    rows.append(("Send lag p50 / p99 (ms)", f"{_fmt(record['send_lag_p50_ms'])} / {_fmt(record['send_lag_p99_ms'])}"))
    for label, value in rows:
        table.add_row(label, value)
    table.caption = escape(record["client_verdict"])
    table.caption_justify = "left"
    return table


def print_summary(console: Console, record: dict) -> None:
    console.print(summary_table(record))
    if record.get("interrupted"):
        console.print("[yellow]Stopped by Ctrl-C: the numbers cover the requests that finished.[/]")
    if record.get("warmup_failures"):
        console.print(f"[yellow]{record['warmup_failures']} of {record['warmup_requests']} warm-up requests failed[/]")
    if record.get("scrape_error"):
        console.print(f"[yellow]--scrape-metrics: {escape(record['scrape_error'])}[/]")
