"""Run records: the summary table on the terminal and one JSON line per run in `--output-file` (schema in
`bench.record`)."""
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
from toolkit.bench.record import BenchRecord
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
        "cached_tokens": out.cached_tokens,
    }
    if out.session is not None:
        row |= {"session": out.session, "turn": out.turn + 1}
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
    """Raises ValueError, before touching the file, when a key has a type its readers do not expect."""
    line = json.dumps(BenchRecord.from_json(clean(record)).to_json())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


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
        ("Shed by the server (503)", f"{record.get('shed', 0)}"),
        ("Duration (s)", _fmt(record["duration"])),
        ("Request throughput (req/s)", _fmt(record["request_throughput"])),
        ("Input / output throughput (tok/s)",
         f"{_fmt(record['input_throughput'], 1)} / {_fmt(record['output_throughput'], 1)}"),
        ("Mean concurrency", _fmt(record["concurrency"])),
    ]
    if record.get("cache_hit_rate") is not None:
        rows.append(("Prefix cache hit rate (server-reported)", _fmt(record["cache_hit_rate"], 3)))
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e_latency", "E2E")):
        stats = "  ".join(f"{s} {_fmt(record[f'{s}_{name}_ms'])}" for s in ("mean", "median", "p90", "p99", "max"))
        rows.append((f"{label} (ms)", stats))
    if "goodput" in record:
        rows.append(("Goodput (req/s) / SLO attainment",
                     f"{_fmt(record['goodput'])} / {_fmt(record['slo_attainment'], 3)}"))
    if record.get("steady"):
        st = record["steady"]
        rows.append(("Steady window (s) / output tok/s / TTFT p99 (ms)",
                     f"{st['t0']:.1f}-{st['t1']:.1f} / {_fmt(st['output_throughput'], 1)} / {_fmt(st['p99_ttft_ms'])}"))
    rows.append(("Send lag p50 / p99 (ms)", f"{_fmt(record['send_lag_p50_ms'])} / {_fmt(record['send_lag_p99_ms'])}"))
    for label, value in rows:
        table.add_row(label, value)
    table.caption = escape(" ".join(filter(None, (record["client_verdict"], record.get("shed_verdict")))))
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
    if record.get("repeats"):
        console.print(repeats_table(record["repeats"]))
    if record.get("stopped_early"):
        stop = record["stopped_early"]
        skipped = ", ".join(f"{r:g}" for r in stop["skipped"])
        console.print(f"[yellow]Stopped early at rate {stop['rate']:g} req/s, past saturation: "
                      f"{escape(stop['reason'])}; skipped rates {skipped} req/s.[/]")
    if record.get("pareto"):
        console.print(pareto_line(record["pareto"]), highlight=False)
    if record.get("by_turn"):
        console.print(turns_line(record), highlight=False)


REPEATED = (("request_throughput", "Request throughput (req/s)"), ("output_throughput", "Output throughput (tok/s)"),
            ("median_ttft_ms", "TTFT p50 (ms)"), ("p99_ttft_ms", "TTFT p99 (ms)"), ("median_tpot_ms", "TPOT p50 (ms)"),
            ("p99_tpot_ms", "TPOT p99 (ms)"), ("median_itl_ms", "ITL p50 (ms)"))


def repeats_table(repeats: dict) -> Table:
    table = Table(title=f"Over {repeats['count']} repeats: mean and 95% confidence interval", title_justify="left")
    for column in ("metric", "mean", "95% CI", "std"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for key, label in REPEATED:
        m = repeats["metrics"].get(key)
        if m is not None:
            table.add_row(label, _fmt(m["mean"]), f"{_fmt(m['ci_low'])} .. {_fmt(m['ci_high'])}", _fmt(m["std"]))
    return table


def pareto_line(pareto: dict) -> str:
    runs = "; ".join(f"rate {p['request_rate']}: {p['per_user_output_throughput']:.1f} per user, "
                     f"{p['output_throughput']:.1f} total" for p in pareto["front"])
    return f"Pareto front (output tok/s per user vs total output tok/s) over {pareto['points']} runs: {runs or '-'}"


def turns_line(record: dict) -> str:
    turns = "; ".join(f"turn {t['turn']}: TTFT {_fmt(t['mean_ttft_ms'])} ms, cache hit {_fmt(t['cache_hit_rate'], 3)}"
                      for t in record["by_turn"])
    return (f"{record['sessions']} sessions of {record['turns']} turns (think time {record['think_time']:g} s, "
            f"{record['skipped_turns']} turns skipped after a failed one): {turns}")
