"""Everything the template shows, gathered from the bench records and the diagnosis (no I/O besides plotting)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from toolkit.diagnose.analysis import Diagnosis
from toolkit.reports import bench_rows, diagnosis_rows
from toolkit.reports.charts import pareto_image, sweep_image, timeline_images

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
    from toolkit.version import __version__

    rows = bench_rows.runs(records)
    return {
        "title": title or default_title(records, diagnosis),
        "version": __version__,
        "generated": datetime.now().astimezone().isoformat(timespec="seconds"),
        "sections": SECTIONS,
        "bench_sources": list(bench_sources),
        "runs": rows,
        "config_rows": bench_rows.config_rows(records) if records else [],
        "verdict_summary": bench_rows.verdict_summary(rows) if rows else None,
        "bottlenecked": bool(bench_rows.bottlenecked(rows)),
        "has_goodput": any("goodput" in r for r in records),
        "latencies": bench_rows.LATENCIES,
        "errors_text": bench_rows.errors_text,
        "failed": bench_rows.failed_rows(rows),
        "sweep": sweep_image(rows),
        "pareto": pareto_image(records),
        "stopped_early": [(r.rate_label, r.get("stopped_early")) for r in rows if r.get("stopped_early")],
        "d": diagnosis,
        "timeline": timeline_images(diagnosis.timeline) if diagnosis else [],
        "dx": diagnosis_rows,
    }
