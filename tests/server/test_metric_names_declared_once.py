"""Every Prometheus metric is declared once, in `io_struct` (issue 48): on the stats field it serves, or in the front
end's table. /metrics builds its collectors from those declarations and the readers (bench's timeline, diagnose's
scrape input) import the names, so no product module holds a declared name as a literal."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from toolkit.runtime.io_struct import FRONT_END_METRICS, METRICS, STATS_METRICS, Metric, SchedulerStats
from toolkit.runtime.server.metrics import RequestMetrics

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("runtime", "bench", "diagnose", "reports", "tune")
DECLARING = REPO / "runtime" / "io_struct.py"


def _product_modules() -> list[Path]:
    return sorted(p for room in PRODUCT for p in (REPO / room).rglob("*.py") if p != DECLARING)


def test_every_exported_stats_field_declares_exactly_one_metric():
    exported = {f.name: f.metadata["metric"] for f in fields(SchedulerStats) if "metric" in f.metadata}
    assert exported == STATS_METRICS and exported
    assert all(isinstance(metric, Metric) for metric in METRICS)
    names = [metric.name for metric in METRICS]
    assert len(names) == len(set(names)), names
    assert all(name.startswith("sglang:") and metric.help for name, metric in zip(names, METRICS))


def test_metrics_serves_exactly_the_declared_metrics_with_their_kind_and_help():
    served = {family.name: family for family in RequestMetrics("m", [100, 100]).registry.collect()}
    declared = {metric.name: metric for metric in METRICS}
    assert served.keys() == declared.keys()
    for name, metric in declared.items():
        assert (served[name].type, served[name].documentation) == (metric.kind, metric.help)


def test_a_stats_counter_grows_by_its_cumulative_field():
    metrics = RequestMetrics("m", 1000)
    for total in (2, 2, 5):
        metrics.on_scheduler_stats(SchedulerStats(total_retracted_reqs=total, num_running_reqs=total))
    text = metrics.render().decode()
    retracted = STATS_METRICS["total_retracted_reqs"].sample
    assert f'{retracted}{{model_name="m"}} 5.0' in text
    assert f'{STATS_METRICS["num_running_reqs"].sample}{{model_name="m"}} 5.0' in text


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.name)
def test_no_product_module_spells_a_declared_metric_name(metric: Metric):
    name = re.compile(re.escape(metric.name) + r"(?![\w:])")
    offenders = [f"{p.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}"
                 for p in _product_modules() for text in [p.read_text(errors="replace")]
                 for m in name.finditer(text)]
    assert not offenders, f"{metric.name} spelled outside io_struct: {offenders}"


def test_the_readers_take_their_names_from_the_declaration():
    from toolkit.bench.timeline import QUEUED, RUNNING
    from toolkit.diagnose.metrics_input import KEY_METRICS

    assert STATS_METRICS["num_running_reqs"].sample in RUNNING and STATS_METRICS["num_queue_reqs"].sample in QUEUED
    quoted = set(KEY_METRICS)
    assert {FRONT_END_METRICS.ttft.sample, STATS_METRICS["total_retracted_reqs"].sample} <= quoted
