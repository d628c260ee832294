"""Prometheus metrics under SGLang's names (docs/log-formats.md §13), so existing SGLang dashboards work.

Every metric is declared in `io_struct` (`STATS_METRICS` on the scheduler's stats fields, `FRONT_END_METRICS`);
this module builds the collectors from those declarations. Stats gauges mirror the scheduler's live counters (sent
with every step) and stats counters grow by their cumulative field; the front end's counters and latency histograms
are observed as tokens reach it.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from toolkit.runtime.io_struct import FRONT_END_METRICS, STATS_METRICS, Metric, SchedulerStats, TokenOutput

KINDS = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}

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
        self.gauges = {key: self._family(metric, multiprocess_mode="mostrecent")
                       for key, metric in STATS_METRICS.items() if metric.kind == "gauge"}
        self.counters = {key: self._family(metric) for key, metric in STATS_METRICS.items() if metric.kind == "counter"}
        front = FRONT_END_METRICS
        for child, value in zip(self._family(front.max_total_num_tokens), [*pools, sum(pools)]):
            child.set(value)
        self.prompt_tokens = self._family(front.prompt_tokens)
        self.generation_tokens = self._family(front.generation_tokens)
        self.cached_tokens = self._family(front.cached_tokens)
        self.num_requests = self._family(front.num_requests)
        self.num_aborted = self._family(front.num_aborted)
        rejected = Counter(front.queue_rejected.name, front.queue_rejected.help, [*names, "reason"],
                           registry=self.registry)
        self.queue_rejected = {reason: [rejected.labels(**labels, reason=reason) for labels in self._series]
                               for reason in QUEUE_REJECT_REASONS}
        self.ttft = self._family(front.ttft)
        self.itl = self._family(front.itl)
        self.e2e = self._family(front.e2e)
        self._counted = [dict.fromkeys(self.counters, 0) for _ in range(self.replicas)]  # the cumulative fields seen
        self._stats: list[SchedulerStats | None] = [None] * self.replicas  # None: not reported yet
        self._pools = pools

    def _family(self, metric: Metric, **options) -> list:
        """The metric's series: one per replica, then the total (one series when there is one replica)."""
        if metric.buckets:
            options["buckets"] = metric.buckets
        collector = KINDS[metric.kind](metric.name, metric.help, self._names, registry=self.registry, **options)
        return [collector.labels(**labels) for labels in self._series]

    def _observed(self, family: list, dp_rank: int) -> list:
        """The replica's series and the total's (the same one series with one replica)."""
        return family if self.replicas == 1 else [family[dp_rank], family[-1]]

    def on_scheduler_stats(self, stats: SchedulerStats, dp_rank: int = 0) -> None:
        self._stats[dp_rank] = stats
        for key, family in self.gauges.items():
            family[dp_rank].set(getattr(stats, key))
        counted = self._counted[dp_rank]
        for key, family in self.counters.items():
            grown = getattr(stats, key) - counted[key]
            if grown > 0:
                for child in self._observed(family, dp_rank):
                    child.inc(grown)
                counted[key] += grown
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
