"""Assembles one run's record (schema in `bench.record`) from its configuration and measurement."""
from __future__ import annotations

from toolkit.bench.benchmark import Measurement
from toolkit.bench.conversation import conversation_record
from toolkit.bench.metrics import summarize
from toolkit.bench.options import rate_label
from toolkit.bench.output import request_row, window
from toolkit.bench.split import workers_record
from toolkit.bench.timeline import DEFAULT_SLICE_SECONDS, slices, steady, timed
from toolkit.bench.verdict import judge, shed_verdict
from toolkit.bench.workload import Workload


def build_record(config: dict, measurement: Measurement, workload: Workload, *, slo_ms: dict[str, float],
                 max_concurrency: int | None, server_log: str | None, details: bool,
                 slice_seconds: float = DEFAULT_SLICE_SECONDS) -> dict:
    run = measurement.run
    record = {**config, "request_rate": rate_label(workload.request_rate), "arrival": workload.arrival}
    record |= summarize(run.outcomes, run.duration, slo_ms)
    if slo_ms:
        record["slo"] = slo_ms
    record |= judge(run.outcomes, run.start, max_concurrency, run.loop_lags).as_record()
    record["shed_verdict"] = shed_verdict(record["shed"], record["num_requests"])
    record |= window(run, server_log)
    record |= {
        "warmup_failures": measurement.warmup_failures,
        "scraped_metrics": measurement.scraped,
        "scrape_error": measurement.scrape_error,
    }
    record |= workers_record(run, measurement.workers, measurement.worker_backend)
    on_clock = timed(run.outcomes, run.start)
    record["steady"] = steady(on_clock, run.started_at)
    record["slice_seconds"] = slice_seconds
    record["slices"] = slices(on_clock, run.duration, slice_seconds, measurement.scraped, run.started_at)
    if workload.turns > 1:
        record |= conversation_record(run.outcomes, len(workload.offsets), workload.turns, workload.think_time)
    if details:
        record["requests"] = [request_row(o, run) for o in run.outcomes]
    return record
