"""`#queue-req` (vLLM: `Waiting`) in steady state.

- `queue.empty_under_load`: >= 90% of steady load lines have no queue while the KV pool is below 90% used and
  the running batch below 90% of its cap: the server had room, the client did not send more.
- `queue.too_long`: >= 25% of steady load lines have a queue above 2000: scheduling overhead grows with the
  queue (and SGLang's `lpm` sorts it every step).
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import Change

EMPTY_FRACTION = 0.9
ROOM_USAGE = 0.9
LONG_QUEUE = 2000
LONG_FRACTION = 0.25


def check(ctx: Context) -> list[Finding]:
    steady = ctx.steady_enough()
    if steady is None:
        return []
    return [f for f in (_empty(ctx, steady), _long(ctx, steady)) if f is not None]


def _empty(ctx: Context, steady) -> Finding | None:
    empty = steady.where(steady["queue_req"] == 0)
    fraction = len(empty) / len(steady)
    usage = steady.median("usage")
    cap = ctx.config.max_running_requests
    running = steady.median("running_req")
    if fraction < EMPTY_FRACTION or not usage < ROOM_USAGE or (cap and running >= 0.9 * cap):
        return None
    return Finding(
        id="queue.empty_under_load", severity="info", title="Queue mostly empty: the client set the pace",
        message=f"The queue was empty in {fraction:.0%} of {len(steady)} steady {ctx.load_word} lines while the KV "
        f"pool was {usage:.0%} used (median) and the batch ran {running:.0f} requests: the server could take more. "
        "If this was a benchmark, raise the client's request rate or concurrency.",
        evidence=evidence(empty, len(steady), median_usage=round(usage, 3), median_running=running),
        action="client: raise the request rate / --max-concurrency",
        tradeoff="More load raises latency once the pool or the running cap fills.", ranks=steady.ranks)


def _long(ctx: Context, steady) -> Finding | None:
    long = steady.where(steady["queue_req"] > LONG_QUEUE)
    fraction = len(long) / len(steady)
    if fraction < LONG_FRACTION:
        return None
    lpm = ctx.config.schedule_policy == "lpm"
    top = int(np.nanmax(steady["queue_req"]))
    return Finding(
        id="queue.too_long", severity="warning", title=f"Queue above {LONG_QUEUE} requests",
        message=f"The queue exceeded {LONG_QUEUE} in {fraction:.0%} of {len(steady)} steady {ctx.load_word} lines "
        f"(max {top}): the scheduler spends time on the queue and requests wait. "
        + ("With lpm the queue is re-sorted by prefix match at every prefill; fcfs avoids that. " if lpm else "")
        + "Slow the client down or add replicas.",
        evidence=evidence(long, len(steady), max_queue=top),
        change=Change("schedule_policy", "fcfs") if lpm else Change("dp", str(ctx.config.dp_size * 2)),
        current=Current.of("lpm" if lpm else ctx.config.dp_size),
        tradeoff="fcfs gives up prefix-aware ordering (fewer cache hits)." if lpm
        else "Another replica needs its own GPUs.",
        ranks=long.ranks,
    )
