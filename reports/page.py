"""Everything the template shows, gathered from the bench records and the diagnosis (no I/O besides plotting)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from diagnose.analysis import Diagnosis
from reports import findings, runs
from reports.charts import sweep_image, timeline_images

SECTIONS: tuple[tuple[str, str], ...] = (
    ("config", "Configuration"), ("verdict", "Client verdict"), ("tables", "Latency and throughput"),
    ("sweep", "Sweep curves"), ("timeline", "Server timeline"), ("diagnosis", "Diagnosis"),
)


def default_title(records: Sequence[dict], diagnosis: Diagnosis | None) -> str:
    if records:
        first = records[0]
        what = " · ".join(str(first[k]) for k in ("model", "dataset_name") if first.get(k))
        n = len(records)
        return f"toolkit report: {what + ' · ' if what else ''}{n} run{'s' if n != 1 else ''}"
    sources = ", ".join(diagnosis.sources) if diagnosis else ""
    return f"toolkit report: {sources}" if sources else "toolkit report"


def context(records: Sequence[dict], diagnosis: Diagnosis | None, title: str | None = None,
            bench_sources: Sequence[str] = ()) -> dict:
    from toolkit import __version__

    rows = runs.runs(records)
    return {
        "title": title or default_title(records, diagnosis),
        "version": __version__,
        "generated": datetime.now().astimezone().isoformat(timespec="seconds"),
        "sections": SECTIONS,
        "bench_sources": list(bench_sources),
        "runs": rows,
        "config_rows": runs.config_rows(records) if records else [],
        "verdict_summary": runs.verdict_summary(rows) if rows else None,
        "bottlenecked": bool(runs.bottlenecked(rows)),
        "latencies": runs.LATENCIES,
        "errors_text": runs.errors_text,
        "failed": runs.failed_rows(rows),
        "sweep": sweep_image(rows),
        "d": diagnosis,
        "timeline": timeline_images(diagnosis.timeline) if diagnosis else [],
        "f": findings,
    }
