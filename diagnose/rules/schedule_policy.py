"""Schedule policy vs prefix reuse (cache hit rate = cached / (cached + new) tokens of steady prefills).

- `schedule_policy.try_lpm`: policy fcfs, hit rate >= 30%, and a queue in >= 20% of steady decode lines
  (lpm only helps when there is a queue to reorder).
- `schedule_policy.try_fcfs`: policy lpm, hit rate < 5%, and median steady queue >= 100: sorting a long
  queue by prefix match costs time and buys nothing.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, ranks_of

HIGH_REUSE = 0.3
QUEUED_FRACTION = 0.2
NO_REUSE = 0.05
LONG_QUEUE = 100


def hit_rate(ctx: Context) -> float | None:
    pre = ctx.timeline.batches("prefill", "steady")
    if len(pre) < MIN_LINES:
        pre = ctx.timeline.batches("prefill")
    cached, new = pre["cached_token"].sum(), pre["new_token"].sum()
    if len(pre) >= MIN_LINES and cached + new > 0:
        return float(cached / (cached + new))
    if ctx.metrics is not None:
        return ctx.metrics.value("sglang:cache_hit_rate")
    return None


def check(ctx: Context) -> list[Finding]:
    steady = ctx.steady()
    policy = ctx.config.schedule_policy
    rate = hit_rate(ctx)
    if len(steady) < MIN_LINES or rate is None or policy is None:
        return []
    queued = float((steady["queue_req"] > 0).mean())
    if policy == "fcfs" and rate >= HIGH_REUSE and queued >= QUEUED_FRACTION:
        return [Finding(
            "schedule_policy.try_lpm", "info", "High prefix reuse with fcfs",
            f"{rate:.0%} of prefill tokens came from the radix cache and a queue formed in {queued:.0%} of "
            "steady decode lines; lpm admits requests that share cached prefixes first.",
            evidence(steady[steady["queue_req"] > 0], len(steady), hit_rate=round(rate, 3)),
            "--schedule-policy", "lpm", "fcfs",
            "lpm can starve requests without a cached prefix (longer tail TTFT).", ranks_of(steady))]
    median_queue = float(steady["queue_req"].median())
    if policy == "lpm" and rate < NO_REUSE and median_queue >= LONG_QUEUE:
        return [Finding(
            "schedule_policy.try_fcfs", "info", "lpm without prefix reuse",
            f"Only {rate:.1%} of prefill tokens hit the cache while the queue held {median_queue:.0f} requests "
            "(median): matching every queued request against the radix tree costs time and reorders nothing.",
            evidence(steady[steady["queue_req"] >= LONG_QUEUE], len(steady), hit_rate=round(rate, 4)),
            "--schedule-policy", "fcfs", "lpm", "No reordering by prefix if reuse appears later.",
            ranks_of(steady))]
    return []
