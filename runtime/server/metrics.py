"""Prometheus metrics under SGLang's names (docs/log-formats.md §13), so existing SGLang dashboards work.

Gauges mirror the scheduler's live counters (sent with every step); counters and latency histograms are
observed by the front end as tokens reach it.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from toolkit.runtime.io_struct import SchedulerStats, TokenOutput

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
               0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               800.0)

# SchedulerStats field → (gauge name, help)
SCHEDULER_GAUGES: dict[str, tuple[str, str]] = {
    "num_running_reqs": ("sglang:num_running_reqs", "The number of running requests."),
    "num_used_tokens": ("sglang:num_used_tokens", "The number of used KV tokens."),
    "token_usage": ("sglang:token_usage", "The KV token usage (used / max_total_num_tokens)."),
    "gen_throughput": ("sglang:gen_throughput", "The generation throughput (token/s) of the last decode log window."),
    "num_queue_reqs": ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    "num_grammar_queue_reqs": ("sglang:num_grammar_queue_reqs", "The number of requests whose grammar is compiling."),
    "cache_hit_rate": ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    "num_retracted_reqs": ("sglang:num_retracted_reqs", "The number of requests retracted by the last retraction."),
    "new_token_ratio": ("sglang:new_token_ratio", "The current new-token ratio of the admission budget."),
}


TOTAL = "all"  # the dp_rank label of the totals over every replica
QUEUE_REJECT_REASONS = ("queue_full", "waiting_timeout")  # SGLang's `reason` label values


class RequestMetrics:
    """With `--dp-size` N every series carries a `dp_rank` label: "0".."N-1" per replica, and "all" for the totals
    (sums; token usage and cache hit rate over the summed tokens). With one replica there is no such label."""

    def __init__(self, model_name: str, max_total_num_tokens: int | list[int]) -> None:
        self.registry = CollectorRegistry()
        pools = max_total_num_tokens if isinstance(max_total_num_tokens, list) else [max_total_num_tokens]
        self.replicas = len(pools)
        names = ["model_name"] + (["dp_rank"] if self.replicas > 1 else [])
        self._series = [{"model_name": model_name, "dp_rank": str(d)} for d in range(self.replicas)]
        self._series.append({"model_name": model_name, "dp_rank": TOTAL})
        if self.replicas == 1:
            self._series = [{"model_name": model_name}]
        self._names = names
        self.gauges = {key: self._family(Gauge, name, doc, multiprocess_mode="mostrecent")
                       for key, (name, doc) in SCHEDULER_GAUGES.items()}
        pool_gauge = self._family(Gauge, "sglang:max_total_num_tokens", "The KV pool size in tokens.")
        for child, value in zip(pool_gauge, [*pools, sum(pools)]):
            child.set(value)
        self.prompt_tokens = self._family(Counter, "sglang:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = self._family(Counter, "sglang:generation_tokens", "Generated tokens of finished "
                                              "requests.")
        self.cached_tokens = self._family(Counter, "sglang:cached_tokens",
                                          "Prompt tokens served from the prefix cache.")
        self.num_requests = self._family(Counter, "sglang:num_requests", "Finished requests.")
        self.num_aborted = self._family(Counter, "sglang:num_aborted_requests", "Aborted requests.")
        self.retracted_total = self._family(Counter, "sglang:num_retracted_requests", "Retracted requests, cumulative.")
        rejected = Counter("sglang:num_queue_rejected_requests", "Requests shed by the waiting queue (503): "
                           "reason queue_full (--max-queued-requests) or waiting_timeout (--queue-timeout).",
                           [*names, "reason"], registry=self.registry)
        self.queue_rejected = {reason: [rejected.labels(**labels, reason=reason) for labels in self._series]
                               for reason in QUEUE_REJECT_REASONS}
        self.ttft = self._family(Histogram, "sglang:time_to_first_token_seconds", "Time to first token.",
                                 buckets=TTFT_BUCKETS)
        self.itl = self._family(Histogram, "sglang:inter_token_latency_seconds", "Time between tokens.",
                                buckets=ITL_BUCKETS)
        self.e2e = self._family(Histogram, "sglang:e2e_request_latency_seconds", "End-to-end request latency.",
                                buckets=E2E_BUCKETS)
        self._retracted_seen = [0] * self.replicas
        self._stats: list[SchedulerStats | None] = [None] * self.replicas  # None: not reported yet
        self._pools = pools

    def _family(self, kind, name: str, doc: str, **options) -> list:
        """The metric's series: one per replica, then the total (one series when there is one replica)."""
        metric = kind(name, doc, self._names, registry=self.registry, **options)
        return [metric.labels(**labels) for labels in self._series]

    def _observed(self, family: list, dp_rank: int) -> list:
        """The replica's series and the total's (the same one series with one replica)."""
        return family if self.replicas == 1 else [family[dp_rank], family[-1]]

    def on_scheduler_stats(self, stats: SchedulerStats, dp_rank: int = 0) -> None:
        self._stats[dp_rank] = stats
        for key, family in self.gauges.items():
            family[dp_rank].set(getattr(stats, key))
        if stats.total_retracted_reqs > self._retracted_seen[dp_rank]:
            for child in self._observed(self.retracted_total, dp_rank):
                child.inc(stats.total_retracted_reqs - self._retracted_seen[dp_rank])
            self._retracted_seen[dp_rank] = stats.total_retracted_reqs
        if self.replicas > 1:
            total = summed_stats([s for s in self._stats if s is not None], self._pools)
            for key, family in self.gauges.items():
                family[-1].set(getattr(total, key))

    def on_first_token(self, seconds: float, dp_rank: int = 0) -> None:
        for child in self._observed(self.ttft, dp_rank):
            child.observe(seconds)

    def on_token_gap(self, seconds: float, dp_rank: int = 0) -> None:
        for child in self._observed(self.itl, dp_rank):
            child.observe(seconds)

    def on_finish(self, e2e_seconds: float, last: TokenOutput, dp_rank: int = 0) -> None:
        for d in (dp_rank,) if self.replicas == 1 else (dp_rank, -1):
            self.e2e[d].observe(e2e_seconds)
            self.num_requests[d].inc()
            self.prompt_tokens[d].inc(last.prompt_tokens)
            self.generation_tokens[d].inc(last.completion_tokens)
            self.cached_tokens[d].inc(last.cached_tokens)

    def on_abort(self, dp_rank: int = 0) -> None:
        for child in self._observed(self.num_aborted, dp_rank):
            child.inc()

    def on_queue_rejected(self, reason: str, dp_rank: int | None = None) -> None:
        """A request shed with 503; `dp_rank` None: refused by the front end before any replica was chosen."""
        family = self.queue_rejected[reason]
        if self.replicas == 1:
            family[0].inc()
            return
        if dp_rank is not None:
            family[dp_rank].inc()
        family[-1].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def summed_stats(replicas: list[SchedulerStats], pools: list[int]) -> SchedulerStats:
    """The replicas' scheduler counters as one: sums, with usage and hit rate over the summed tokens (`pools`: every
    replica's max_total_num_tokens) and the mean new-token ratio."""
    def total(key: str) -> float:
        return sum(getattr(stats, key) for stats in replicas)

    summed = SchedulerStats(**{key: total(key) for key in (
        "num_running_reqs", "num_used_tokens", "num_queue_reqs", "num_grammar_queue_reqs", "gen_throughput", "input_throughput",
        "num_retracted_reqs", "total_retracted_reqs", "total_prefill_tokens", "total_cached_tokens",
        "total_generated_tokens", "total_decode_steps", "total_prefill_batches")})
    summed.token_usage = round(summed.num_used_tokens / sum(pools), 4)
    seen = summed.total_prefill_tokens + summed.total_cached_tokens
    summed.cache_hit_rate = summed.total_cached_tokens / seen if seen else 0.0
    summed.new_token_ratio = total("new_token_ratio") / len(replicas) if replicas else 0.0
    summed.memory_leak_detected = any(stats.memory_leak_detected for stats in replicas)
    return summed
