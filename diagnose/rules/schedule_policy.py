"""Schedule policy vs prefix reuse (SGLang) (cache hit rate = cached / (cached + new) tokens of steady prefills).

- `schedule_policy.try_lpm`: policy fcfs, hit rate >= 30%, and a queue in >= 20% of steady decode lines
  (lpm only helps when there is a queue to reorder).
- `schedule_policy.try_fcfs`: policy lpm, hit rate < 5%, and median steady queue >= 100: sorting a long
  queue by prefix match costs time and buys nothing.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.metrics_input import CACHE_HIT_RATE
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.vocabulary import Change

HIGH_REUSE = 0.3
QUEUED_FRACTION = 0.2
NO_REUSE = 0.05
LONG_QUEUE = 100


def hit_rate(ctx: Context) -> float | None:
    pre = ctx.timeline.series("prefill", "steady")
    if len(pre) < MIN_LINES:
        pre = ctx.timeline.series("prefill")
    cached, new = float(np.nansum(pre["cached_token"])), float(np.nansum(pre["new_token"]))
    if len(pre) >= MIN_LINES and cached + new > 0:
        return float(cached / (cached + new))
    if ctx.metrics is not None:
        return ctx.metrics.value(CACHE_HIT_RATE)
    return None


def check(ctx: Context) -> list[Finding]:
    if ctx.config.vllm:
        return []
    steady = ctx.steady_enough()
    policy = ctx.config.schedule_policy
    if steady is None:
        return []
    rate = hit_rate(ctx)
    if rate is None or policy is None:
        ctx.cannot_judge("no prefix cache hit rate (prefill lines or --metrics)" if rate is None
                         else "the schedule policy is not in the log")
        return []
    queued = steady.fraction(steady["queue_req"] > 0)
    if policy == "fcfs" and rate >= HIGH_REUSE and queued >= QUEUED_FRACTION:
        return [Finding(
            id="schedule_policy.try_lpm", severity="info", title="High prefix reuse with fcfs",
            message=f"{rate:.0%} of prefill tokens came from the radix cache and a queue formed in {queued:.0%} of "
            "steady decode lines; lpm admits requests that share cached prefixes first.",
            evidence=evidence(steady.where(steady["queue_req"] > 0), len(steady), hit_rate=round(rate, 3)),
            change=Change("schedule_policy", "lpm"), current=Current.of("fcfs"),
            tradeoff="lpm can starve requests without a cached prefix (longer tail TTFT).", ranks=steady.ranks)]
    median_queue = steady.median("queue_req")
    if policy == "lpm" and rate < NO_REUSE and median_queue >= LONG_QUEUE:
        return [Finding(
            id="schedule_policy.try_fcfs", severity="info", title="lpm without prefix reuse",
            message=f"Only {rate:.1%} of prefill tokens hit the cache while the queue held {median_queue:.0f} requests "
            "(median): matching every queued request against the radix tree costs time and reorders nothing.",
            evidence=evidence(steady.where(steady["queue_req"] >= LONG_QUEUE), len(steady), hit_rate=round(rate, 4)),
            change=Change("schedule_policy", "fcfs"), current=Current.of("lpm"),
            tradeoff="No reordering by prefix if reuse appears later.", ranks=steady.ranks)]
    return []
