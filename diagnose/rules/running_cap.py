"""`running_cap.pinned`: the running batch sits at `max_running_requests` while KV memory is free.

Trigger: >= 50% of steady decode lines run >= 98% of the cap, most of those have a queue, and their median
token usage is < 0.8. Suggest cap x min(2, 0.9 / usage).
"""
from __future__ import annotations

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, ranks_of

PINNED = 0.98
PINNED_FRACTION = 0.5
FREE_USAGE = 0.8
TARGET_USAGE = 0.9


def check(ctx: Context) -> list[Finding]:
    cap = ctx.config.max_running_requests
    steady = ctx.steady()
    if not cap or len(steady) < MIN_LINES:
        return []
    pinned = steady[steady["running_req"] >= PINNED * cap]
    if len(pinned) / len(steady) < PINNED_FRACTION or (pinned["queue_req"] > 0).mean() < 0.5:
        return []
    usage = float(pinned["usage"].median())
    if not usage < FREE_USAGE:
        return []
    suggested = int(cap * min(2.0, TARGET_USAGE / max(usage, 0.05)))
    return [Finding(
        "running_cap.pinned", "warning", "Running batch pinned at max_running_requests",
        f"{len(pinned) / len(steady):.0%} of {len(steady)} steady decode lines ran {cap} requests (the cap) "
        f"with a queue waiting, while token usage was only {usage:.2f}: the cap, not memory, limited the batch.",
        evidence(pinned, len(steady), max_running_requests=cap, median_usage=round(usage, 3)),
        "--max-running-requests", str(suggested), str(cap),
        "Larger batches raise inter-token latency and KV pressure (watch retractions).", ranks_of(pinned))]
