"""Prometheus metrics under SGLang's names (docs/log-formats.md §13), so existing SGLang dashboards work.

Gauges mirror the scheduler's live counters (sent with every step); counters and latency histograms are
observed by the front end as tokens reach it.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from toolkit.runtime.io_struct import TokenOutput

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
               0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               800.0)

# scheduler stat → (gauge name, help)
SCHEDULER_GAUGES: dict[str, tuple[str, str]] = {
    "num_running_reqs": ("sglang:num_running_reqs", "The number of running requests."),
    "num_used_tokens": ("sglang:num_used_tokens", "The number of used KV tokens."),
    "token_usage": ("sglang:token_usage", "The KV token usage (used / max_total_num_tokens)."),
    "gen_throughput": ("sglang:gen_throughput", "The generation throughput (token/s) of the last decode log window."),
    "num_queue_reqs": ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    "cache_hit_rate": ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    "num_retracted_reqs": ("sglang:num_retracted_reqs", "The number of requests retracted by the last retraction."),
    "new_token_ratio": ("sglang:new_token_ratio", "The current new-token ratio of the admission budget."),
}


class RequestMetrics:
    def __init__(self, model_name: str, max_total_num_tokens: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._labels = labels
        self.gauges = {
            key: Gauge(name, doc, list(labels), registry=self.registry, multiprocess_mode="mostrecent").labels(**labels)
            for key, (name, doc) in SCHEDULER_GAUGES.items()
        }
        Gauge("sglang:max_total_num_tokens", "The KV pool size in tokens.", list(labels),
              registry=self.registry).labels(**labels).set(max_total_num_tokens)
        self.prompt_tokens = self._counter("sglang:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = self._counter("sglang:generation_tokens", "Generated tokens of finished requests.")
        self.cached_tokens = self._counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache.")
        self.num_requests = self._counter("sglang:num_requests", "Finished requests.")
        self.num_aborted = self._counter("sglang:num_aborted_requests", "Aborted requests.")
        self.retracted_total = self._counter("sglang:num_retracted_requests", "Retracted requests, cumulative.")
        self.ttft = self._histogram("sglang:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = self._histogram("sglang:inter_token_latency_seconds", "Time between tokens.", ITL_BUCKETS)
        self.e2e = self._histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS)
        self._retracted_seen = 0

    def _counter(self, name: str, doc: str):
        return Counter(name, doc, list(self._labels), registry=self.registry).labels(**self._labels)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]):
        return Histogram(name, doc, list(self._labels), buckets=buckets, registry=self.registry).labels(**self._labels)

    def on_scheduler_stats(self, stats: dict[str, Any]) -> None:
        for key, gauge in self.gauges.items():
            if key in stats:
                gauge.set(stats[key])
        total = stats.get("total_retracted_reqs", self._retracted_seen)
        if total > self._retracted_seen:
            self.retracted_total.inc(total - self._retracted_seen)
            self._retracted_seen = total

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def on_finish(self, e2e_seconds: float, last: TokenOutput) -> None:
        self.e2e.observe(e2e_seconds)
        self.num_requests.inc()
        self.prompt_tokens.inc(last.prompt_tokens)
        self.generation_tokens.inc(last.completion_tokens)
        self.cached_tokens.inc(last.cached_tokens)

    def on_abort(self) -> None:
        self.num_aborted.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
