"""`running_cap.pinned`: the running batch sits at its cap (SGLang `max_running_requests`, vLLM
`--max-num-seqs`) while KV memory is free.

Trigger: >= 50% of steady load lines run >= 98% of the cap, most of those have a queue, and their median KV
usage is < 0.8. The suggestion is sized by the evidence, not a fixed doubling: the cap the KV pool supports at a
0.9 usage (cap x 0.9 / usage, since usage grows with the running requests), no more than the requests that wanted
to run (the largest running + queued seen while pinned), at most `MAX_STEP` x the cap, and always above it.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.flags import flag
from toolkit.diagnose.ideas import Change
from toolkit.diagnose.rules.context import Context

PINNED = 0.98
PINNED_FRACTION = 0.5
FREE_USAGE = 0.8
TARGET_USAGE = 0.9
MAX_STEP = 16  # NOTE: bounds one step: the usage measured at a small cap extrapolates poorly far beyond it


def check(ctx: Context) -> list[Finding]:
    cap = ctx.config.max_running_requests
    if not cap:
        ctx.cannot_judge("the running cap is not in the log")
        return []
    steady = ctx.steady_enough()
    if steady is None:
        return []
    pinned = steady.where(steady["running_req"] >= PINNED * cap)
    if len(pinned) / len(steady) < PINNED_FRACTION or pinned.fraction(pinned["queue_req"] > 0) < 0.5:
        return []
    usage = pinned.median("usage")
    if not usage < FREE_USAGE:
        return []
    wanting = pinned["running_req"] + pinned["queue_req"]
    demand = int(np.nanmax(wanting)) if np.isfinite(wanting).any() else None
    suggested = supported_cap(cap, usage, demand)
    name = flag(ctx.config, "running_cap")
    return [Finding(
        "running_cap.pinned", "warning", f"Running batch pinned at {name.lstrip('-').replace('-', '_')}",
        f"{len(pinned) / len(steady):.0%} of {len(steady)} steady {ctx.load_word} lines ran {cap} requests (the "
        f"cap) with a queue waiting, while KV usage was only {usage:.2f}: the cap, not memory, limited the batch.",
        evidence(pinned, len(steady), max_running_requests=cap, median_usage=round(usage, 3),
                 peak_demand=demand),
        Change("running_cap", str(suggested)), str(cap),
        "Larger batches raise inter-token latency and KV pressure (watch retractions).", pinned.ranks)]


def supported_cap(cap: int, usage: float, demand: int | None) -> int:
    """The cap the pool supports at `TARGET_USAGE`, bounded by the demand (when known) and by `MAX_STEP` x cap;
    above `cap`."""
    pool = cap * TARGET_USAGE / max(usage, 0.01)
    bound = min(pool, cap * MAX_STEP) if demand is None else min(pool, demand, cap * MAX_STEP)
    return max(cap + 1, int(bound))
