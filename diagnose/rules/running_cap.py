"""`running_cap.pinned`: the running batch sits at its cap (SGLang `max_running_requests`, vLLM
`--max-num-seqs`) while KV memory is free. `running_cap.plateau`: the cap is not in the log, but the batch stays
flat with a queue on every line and free KV memory (SGLang; a short excerpt at the confidence of its lines).

Trigger: >= 50% of steady load lines run >= 98% of the cap, most of those have a queue, and in most of those
the KV pool has room for the next request (`rules.room`: what is left holds one more request of the running ones'
size) at a median usage below 0.8. Evidence is counted in seconds of load: fewer than 10 steady lines still judge when they span at least
`SHORT_SECONDS` (vLLM prints a line every 10 s: 40 s of a pinned cap with a queue is evidence), at `low`
confidence (`info`) below `MEDIUM_SECONDS`, `medium` below `HIGH_SECONDS`. The suggestion is sized by the evidence, not a fixed doubling: the cap the KV pool supports at a
0.9 usage (cap x 0.9 / usage, since usage grows with the running requests), no more than the requests that wanted
to run (the largest running + queued seen while pinned), at most `MAX_STEP` x the cap, and always above it. Where
the pool is capped by hand (`--max-total-tokens`, vLLM `--num-gpu-blocks-override`) and it is what keeps that cap
below the demand, the pool is not a limit of the machine: the cap the demand wants comes with the pool raised to
hold that many requests of the size this log's requests grow to (`rules.room`) at 0.9 usage (a cap raised only to
what a hand-set pool holds pins the batch at the pool next, and then neither rule has a step left).

`running_cap.tiny` (info, low confidence: a start-up alone shows no load): a cap of at most `TINY_CAP` requests
while the KV pool holds `ROOM_FACTOR` x as many requests of the whole context length or more (ktransformers#1870:
1 running, a pool of 580,364 tokens at 8,192: 70). Suggest the largest power of two the pool holds at full length.
"""
from __future__ import annotations

import math

import numpy as np

from toolkit.diagnose.findings import Current, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_most
from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.rules.room import has_room, request_size, requests_held
from toolkit.diagnose.vocabulary import Change

PINNED = 0.98
PINNED_FRACTION = 0.5
FREE_USAGE = 0.8
TARGET_USAGE = 0.9
MAX_STEP = 16  # NOTE: bounds one step: the usage measured at a small cap extrapolates poorly far beyond it
PLATEAU_LINES = 5  # `running_cap.plateau`: lines that show it
PLATEAU_MIN = 8    # a batch this large or more (a few requests running is the load, not a cap)
FLAT = 0.25        # the batch within this share of its largest on every line
TINY_CAP = 4
ROOM_FACTOR = 8
SHORT_LINES = 3  # a short log judges from this many steady lines ...
SHORT_SECONDS = 30.0  # ... spanning this much load
MEDIUM_SECONDS = 120.0
HIGH_SECONDS = 300.0


def check(ctx: Context) -> list[Finding]:
    cap = ctx.config.max_running_requests
    if not cap:
        ctx.cannot_judge("the running cap is not in the log")
        return _plateau(ctx)
    steady = ctx.steady()
    confidence = "high" if len(steady) >= MIN_LINES else _confidence_of_seconds(steady)
    if confidence is None:
        ctx.steady_enough()  # notes why the load could not be judged
        return _tiny(ctx, cap)
    pinned = steady.where(steady["running_req"] >= PINNED * cap)
    if len(pinned) / len(steady) < PINNED_FRACTION or pinned.fraction(pinned["queue_req"] > 0) < 0.5:
        return []
    usage = pinned.median("usage")
    # NOTE: usage below FREE_USAGE (a larger cap is then worth its step) and room for the next request
    pool = ctx.config.max_total_num_tokens
    size = request_size(steady, pool)
    if not usage < FREE_USAGE or pinned.fraction(has_room(pinned, pool, size)) < 0.5:
        return []
    wanting = pinned["running_req"] + pinned["queue_req"]
    demand = int(np.nanmax(wanting)) if np.isfinite(wanting).any() else None
    change, pool_note = _with_a_larger_pool(ctx.config, supported_cap(cap, usage, demand), cap, demand, size)
    name = ctx.config.flag("running_cap")
    seconds = _seconds(steady)
    short = "" if confidence == "high" else f" Only {seconds:.0f} s of load: confirm on a longer log."
    return [Finding(
        id="running_cap.pinned", severity="info" if confidence == "low" else "warning",
        title=f"Running batch pinned at {name.lstrip('-').replace('-', '_')}",
        message=f"{len(pinned) / len(steady):.0%} of {len(steady)} steady {ctx.load_word} lines ran {cap} requests "
        f"(the cap) with a queue waiting, while the KV pool had room for more (usage {usage:.2f}): the cap, not "
        f"memory, limited the batch.{pool_note}{short}",
        evidence=evidence(pinned, len(steady), max_running_requests=cap, median_usage=round(usage, 3),
                 peak_demand=demand, load_seconds=round(seconds)), change=change,
        current=Current.of(cap), tradeoff="Larger batches raise inter-token latency and KV pressure (watch "
        "retractions).", ranks=pinned.ranks, confidence=confidence)]


def _with_a_larger_pool(cfg: ServerConfig, supported: int, cap: int, demand: int | None,
                        size: float | None) -> tuple[Change, str]:
    """The `supported` cap (what the pool supports), or, where a hand-set pool keeps it below the demand, the cap the demand
    wants (at most MAX_STEP x cap) with the pool cap raised, in its own unit (tokens, or vLLM's blocks), to hold
    that many requests of `size` at TARGET_USAGE; and the sentence that says so."""
    pool, pool_cap = cfg.max_total_num_tokens, cfg.value("kv_cap")
    if not (isinstance(pool_cap, int) and pool_cap > 0 and pool and size and demand and demand > supported):
        return Change("running_cap", str(supported)), ""
    wanted = min(demand, cap * MAX_STEP)
    larger = math.ceil(pool_cap * wanted * size / TARGET_USAGE / pool)
    note = (f" The pool is capped by hand ({cfg.flag('kv_cap')} {pool_cap}: {pool:,} tokens, "
            f"{requests_held(pool, size)} requests of the ~{size:,.0f} tokens these grow to), which would pin the "
            f"batch next: raised to {larger} alongside, for {wanted} requests.")
    return Change("running_cap", str(wanted), companions=(Change("kv_cap", str(larger)),)), note


def _seconds(rows: Rows) -> float:
    """The load the lines cover: their time span and one interval more (each line reports the interval before
    it); 0 without time."""
    times = rows["time"][~np.isnan(rows["time"])]
    if len(times) < 2:
        return 0.0
    span = float(times.max() - times.min())
    return span + span / (len(times) - 1)


def _confidence_of_seconds(rows: Rows) -> str | None:
    """A short log's confidence by the seconds of load it shows; None where too little to judge."""
    seconds = _seconds(rows)
    if len(rows) < SHORT_LINES or seconds < SHORT_SECONDS:
        return None
    return "low" if seconds < MEDIUM_SECONDS else "medium" if seconds < HIGH_SECONDS else "high"


def _plateau(ctx: Context) -> list[Finding]:
    """SGLang, the cap not in the log: from the line where the running batch first reaches its plateau on, the
    batch flat (within FLAT of its largest, PLATEAU_MIN requests or more, no larger at the end than at the start)
    while requests wait on every line and KV memory is free; the load lines, or an SGLang log's prefill lines
    where they are more (sglang#4759: 27-32 running, 54-68 queued, usage 0.01)."""
    if ctx.config.vllm:
        return []  # NOTE: vLLM's requests waiting with free KV are `usage.low_while_queued`'s (its token budget)
    rows = max((ctx.timeline.load(), ctx.timeline.series("prefill")), key=len)
    if len(rows) < PLATEAU_LINES or not all(name in rows for name in ("running_req", "queue_req", "usage")):
        return []
    running = np.nan_to_num(rows["running_req"], nan=0.0)
    top = float(np.max(running))
    reached = np.flatnonzero(running >= (1 - FLAT) * top)
    if top < PLATEAU_MIN or not len(reached):
        return []
    rows = rows.where(np.arange(len(rows)) >= reached[0])  # NOTE: from where the batch first reached its plateau
    low = float(np.min(rows["running_req"]))
    usage = rows.median("usage")
    flat = rows["running_req"]
    # NOTE: a batch still growing (sglang#2255: 69 -> 75 with 130 queued) is admission at work, not a cap
    if len(rows) < PLATEAU_LINES or low < (1 - FLAT) * top or flat[-1] > flat[0] \
            or not (rows["queue_req"] > 0).all() or not usage < FREE_USAGE:
        return []
    confidence = confidence_of(len(rows), MIN_LINES)
    name = ctx.config.flag("running_cap")
    return [Finding(
        id="running_cap.plateau", severity="info" if confidence == "low" else "warning",
        title="Running batch flat with a queue",
        message=f"In all {len(rows)} lines the batch ran {low:.0f}-{top:.0f} requests while "
        f"{rows.median('queue_req'):.0f} waited (median) and KV usage was {usage:.2f}: a cap, not memory, limits the "
        f"batch. The cap is not in the log: {name} (speculative decoding lowers SGLang's default), or the largest "
        "CUDA-graph batch.", evidence=evidence(rows, len(rows), largest_running=top, median_usage=round(usage, 3)),
        change=Change("running_cap", direction=1), current=None,
        tradeoff="Larger batches raise inter-token latency and KV pressure (watch retractions).", ranks=rows.ranks,
        confidence=confidence)]


def _tiny(ctx: Context, cap: int) -> list[Finding]:
    cfg = ctx.config
    pool, context = cfg.max_total_num_tokens, cfg.context_len
    if cfg.vllm or cap > TINY_CAP or not pool or not context or pool < ROOM_FACTOR * cap * context:
        return []
    held = pool // context
    suggested = pow2_at_most(held)
    name = cfg.flag("running_cap")
    return [Finding(
        id="running_cap.tiny", severity="info", title=f"At most {cap} request{'s' if cap > 1 else ''} may run at once",
        message=f"{name} is {cap} while the KV pool holds {pool} tokens: {held} requests of the whole context length "
        f"({context} tokens) at once. Every other request waits, however much of the pool is free. (The start-up "
        f"alone shows no load: set it to {suggested} unless one request at a time is what you want.)",
        evidence=evidence_events(ctx.timeline.kind("pool")[-1:] or ctx.timeline.kind("kv_alloc")[-1:],
                        max_running_requests=cap, max_total_num_tokens=pool, context_len=context),
        change=Change("running_cap", str(suggested)), current=Current.of(cap),
        tradeoff="More requests at once: more throughput, each decoding a little slower.", confidence="low")]


def supported_cap(cap: int, usage: float, demand: int | None) -> int:
    """The cap the pool supports at `TARGET_USAGE`, bounded by the demand (when known) and by `MAX_STEP` x cap;
    above `cap`."""
    pool = cap * TARGET_USAGE / max(usage, 0.01)
    bound = min(pool, cap * MAX_STEP) if demand is None else min(pool, demand, cap * MAX_STEP)
    return max(cap + 1, int(bound))
