"""`build_report(...)`: diagnose the server log over the bench window, render the page, write it."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from toolkit.diagnose.analysis import Diagnosis, analyze
from toolkit.bench.record import BenchRecord
from toolkit.diagnose.bench_input import BenchInput
from toolkit.reports.inputs import ReportError, bench_window, check_log
from toolkit.reports.page import context
from toolkit.reports.render import render_html


def diagnose_log(records: Sequence[dict], server_log: str | Path) -> Diagnosis:
    """The log's diagnosis over the runs' time window, with the runs as client-side evidence."""
    bench = BenchInput("bench records", tuple(BenchRecord.from_json(r) for r in records)) if records else None
    try:
        return analyze([check_log(server_log)], bench=bench, window=bench_window(records))
    except (OSError, EOFError) as exc:
        raise ReportError(f"{server_log}: cannot read ({exc})") from None


def render_report(records: Sequence[dict], diagnosis: Diagnosis | None, title: str | None = None,
                  bench_sources: Sequence[str] = ()) -> str:
    """The page as HTML text; either input may be missing (its sections then say so)."""
    return render_html(context(records, diagnosis, title, bench_sources))


def write_html(html: str, out: str | Path) -> Path:
    path = Path(out)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{out}: cannot write the report ({exc.strerror or exc})") from None
    return path


def build_report(bench_records: Sequence[dict], server_log: str | Path | None, out: str | Path,
                 title: str | None = None, bench_sources: Sequence[str] = ()) -> Path:
    """Write the report for `bench_records` (parsed `toolkit bench` JSONL) and/or `server_log` to `out`.

    Raises `ReportError` (a `ValueError`, one line) when there is nothing to report or a file cannot be read."""
    if not bench_records and server_log is None:
        raise ReportError("nothing to report: give bench records (--bench) and/or a server log (--server-log)")
    diagnosis = diagnose_log(bench_records, server_log) if server_log is not None else None
    return write_html(render_report(bench_records, diagnosis, title, bench_sources), out)
