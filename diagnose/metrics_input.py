"""`--metrics FILE|URL`: a Prometheus text scrape (SGLang metric names, docs/log-formats.md §13) as evidence."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from toolkit.runtime.io_struct import FRONT_END_METRICS, STATS_METRICS  # torch-free: the declared metric names

_STATS, _FRONT = STATS_METRICS, FRONT_END_METRICS
CACHE_HIT_RATE = _STATS["cache_hit_rate"].sample
# Metrics worth quoting, in report order; histograms are quoted by their mean (sum / count). The kv_* and
# time_per_output_token ones are SGLang's, not served by toolkit serve.
KEY_METRICS = (
    _STATS["num_running_reqs"].sample, _STATS["num_queue_reqs"].sample, _STATS["token_usage"].sample,
    _STATS["num_used_tokens"].sample,
    "sglang:kv_used_tokens", "sglang:kv_evictable_tokens", "sglang:kv_available_tokens",
    CACHE_HIT_RATE, _STATS["gen_throughput"].sample, _STATS["num_retracted_reqs"].sample,
    _STATS["total_retracted_reqs"].sample, _FRONT.num_requests.sample, _FRONT.num_aborted.sample,
    _FRONT.prompt_tokens.sample, _FRONT.generation_tokens.sample, _FRONT.cached_tokens.sample,
    _FRONT.ttft.sample, _FRONT.itl.sample, "sglang:time_per_output_token_seconds", _FRONT.e2e.sample,
)
TIMEOUT_S = 5.0


@dataclass(slots=True)
class Metrics:
    """Samples by name (`name{labels}` flattened to the name), summed over labels for counters and averaged
    for gauges; histogram means under the family name."""

    source: str
    values: dict[str, float] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        return self.values.get(name)

    def quoted(self) -> dict[str, float]:
        return {k: self.values[k] for k in KEY_METRICS if k in self.values}


def read_metrics(source: str) -> Metrics:
    """Read a scrape from a file path or an http(s) URL; raises `ValueError` with a one-line reason."""
    import urllib.request  # only with --metrics: start-up without it stays fast

    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=TIMEOUT_S) as resp:  # noqa: S310 - user-given URL
                text = resp.read().decode("utf-8", "replace")
        else:
            text = Path(source).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ValueError(f"cannot read metrics from {source}: {exc}") from exc
    return parse_metrics(text, source)


def parse_metrics(text: str, source: str = "-") -> Metrics:
    from prometheus_client.parser import text_string_to_metric_families

    metrics = Metrics(source)
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # noqa: BLE001 - the parser raises several types on bad input
        raise ValueError(f"{source} is not Prometheus text: {exc}") from exc
    for family in families:
        name = family.name
        gauges, sums, counts = [], 0.0, 0.0
        for s in family.samples:
            if s.name.endswith("_sum"):
                sums += s.value
            elif s.name.endswith("_count"):
                counts += s.value
            elif s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            else:
                gauges.append((s.name, s.value))
        if family.type in ("histogram", "summary"):
            if counts:
                metrics.values[name] = sums / counts
            continue
        for sample_name, _ in gauges:
            vals = [v for n, v in gauges if n == sample_name]
            metrics.values[sample_name] = sum(vals) if family.type == "counter" else sum(vals) / len(vals)
    return metrics
