"""The KV pool's capacity against what the server was asked to hold.

- `capacity.pool_bound` (warning): in >= 50% of the steady load lines where requests wait (5 such lines at least),
  the KV pool has no room for the next one (`rules.room`: usage >= 0.9, or what is left holds less than a running
  request's tokens: a pool of 1,024 tokens 86 % used by two requests): the pool, not the scheduler, limits the
  batch. A pool capped by hand (`--max-total-tokens`, vLLM's `--num-gpu-blocks-override`) is raised to hold the
  demand: the running and waiting requests of the median bound line at the size requests grow to (1.25x to 16x the
  cap), with a hand-set running cap below what that pool holds raised alongside. Else more KV memory (SGLang: raise
  `--mem-fraction-static` toward 6.5 GB left when more than 8 GB are left; vLLM: `--gpu-memory-utilization` up to
  0.95), else an fp8 KV cache, else smaller outputs (the client's `max_tokens`). With the memory fraction not in the
  log it asks for more KV memory (higher), fp8 KV the alternative, unless start-up shows little memory left. A short
  excerpt (fewer than 10 steady lines) gets the finding when >= 75% of its load lines are full with a queue, at `low`
  confidence (1-3 lines, `info`) or `medium` (4-9).
- `capacity.context_exceeds_pool` (warning): `max_total_num_tokens` (vLLM: its KV cache size in tokens) is
  below the context length: one request at full context cannot fit. Suggest a context length the pool holds.
- `capacity.input_too_long` (warning): SGLang rejected inputs longer than it allows (`Input length (N tokens)
  exceeds the maximum allowed length (M tokens)`; M is min(context length, pool) - 6). The context length the
  limit (the pool at least as large, or M + 6 at the context length): the inputs are too long for the model (an
  action for the client); else, or with the context length not in the log: the KV pool limits the input, so a
  context length of M + 6 says so up front, more KV memory or an fp8 KV cache serves longer ones.
- vLLM prints how many requests at full context its KV cache holds (`Maximum concurrency for L tokens per
  request: Cx`): where it does, C is the fit and C x L the tokens the suggestions use (a hybrid model's KV token
  count is not its per-request limit).
- `capacity.small_pool` (warning; info at low confidence): the log does not size the pool, and a burst of prefill
  lines with requests waiting implies it below 16,384 tokens (the tokens prefilled since the first line over the
  usage's rise, while the running count grows by exactly what each line admitted; sglang#2777: ~5,400 tokens, one
  request per batch while 57-62 wait): more KV memory.
- `capacity.pool_vs_concurrency` (info): the user asked for R concurrent requests (an explicit
  `--max-running-requests` / `--max-num-seqs`) at up to `context_len` tokens each, and the pool holds fewer
  than R full-context requests. No flag: with short requests R is right; with long ones either the cap the pool
  holds at full context or a context length that fits R is, and only the workload tells which (when the pool
  fills, `capacity.pool_bound` and `retraction.frequent` say so with their flags).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import Current, Evidence, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import MIN_LINES, Context, memory_fraction, more_kv_memory
from toolkit.diagnose.rules.gpu_memory import LOW_GB
from toolkit.diagnose.rules.room import no_room, request_size, requests_held, waiting_at_full
from toolkit.diagnose.vocabulary import Change

FULL_USAGE = 0.9
BOUND_FRACTION = 0.5
SPARE_GB = 8.0
TARGET_GB = 6.5
SHORT_FRACTION = 0.75  # a short excerpt: this share of its load lines full with a queue
MIN_FULL_LINES = MIN_LINES // 2  # a long log: at least this many lines full with a queue (a brief queue is no bound)
DEMAND_QUANTILE = 0.9  # the demand a hand-set pool is sized for: nearly the most requests that wanted to run at once
MIN_GROWTH, MAX_GROWTH = 1.25, 16.0  # a hand-set pool cap raised to the demand: at least this much, at most that
CONCURRENCY_PRINTED = 0.01  # vLLM prints its concurrency to 2 decimals: closer than this to pool / context, the same


def check(ctx: Context) -> list[Finding]:
    return [f for f in (_pool_vs_context(ctx), _pool_bound(ctx), _input_too_long(ctx), _small_pool(ctx))
            if f is not None]


SMALL_POOL_TOKENS = 16384  # a GPU server's KV pool is rarely this small: the memory went elsewhere
MIN_USAGE_RISE = 0.05  # usage prints two decimals: over a rise this large its rounding errs by at most 10%
BURST_SECONDS = 5.0  # prefill lines this close together: decoding in between adds little to the usage


def _small_pool(ctx: Context) -> Finding | None:
    """A pool the log does not size, implied tiny by a burst of prefill lines with requests waiting (sglang#2777:
    381 tokens raise the usage from 0.00 to 0.07, a pool of ~5,400 tokens, one request admitted per batch while
    57-62 wait)."""
    if ctx.config.max_total_num_tokens is not None or not ctx.config.on_gpu:
        return None
    prefill = ctx.timeline.series("prefill")
    if not all(name in prefill for name in ("new_seq", "new_token", "usage", "running_req", "queue_req")):
        return None
    implied = [found for found in map(_implied_pool, map(prefill.of_rank, prefill.ranks)) if found is not None]
    if not implied:
        return None
    pool, rows = min(implied, key=lambda found: found[0])
    if pool >= SMALL_POOL_TOKENS or not bool((rows["queue_req"] > 0).any()):
        return None
    confidence = confidence_of(len(rows), MIN_LINES)
    tokens, rise = int(rows["new_token"][:-1].sum()), float(rows["usage"][-1] - rows["usage"][0])
    return Finding(
        id="capacity.small_pool", severity="info" if confidence == "low" else "warning", title="A very small KV pool",
        message=f"{tokens:,} prefilled tokens raised the KV usage by {rise:.2f}: a pool of about {pool:,.0f} tokens, "
        f"while up to {int(np.nanmax(rows['queue_req']))} requests wait. Each admitted request reserves room for its "
        "output, so a pool this small admits few at a time.",
        evidence=evidence(rows, len(rows), implied_pool_tokens=round(pool), prefilled_tokens=tokens),
        change=more_kv_memory(ctx.config) or Change("kv_memory", direction=1), current=memory_fraction(ctx.config),
        tradeoff="More KV memory leaves less for activations and graphs.", ranks=rows.ranks, confidence=confidence)


def _implied_pool(rows: Rows) -> tuple[float, Rows] | None:
    """(pool tokens, the lines) a rank's first prefill lines imply: each prints the usage before its batch, and
    while the running count grows by exactly the requests the line before admitted (nothing finished) within
    BURST_SECONDS, the tokens prefilled since the first line over the usage's rise is the pool's size."""
    running, joined, usage = rows["running_req"], rows["new_seq"], rows["usage"]
    time = rows["time"]
    end = 1
    while (end < len(rows) and running[end] == running[end - 1] + joined[end - 1]
           and not (time[end] - time[0] > BURST_SECONDS)):
        end += 1
    rise = usage[end - 1] - usage[0]
    if end < 3 or not rise >= MIN_USAGE_RISE:
        return None
    run = rows.head(end)
    return float(run["new_token"][:-1].sum()) / float(rise), run


INPUT_MARGIN = 6  # SGLang allows min(context length, pool) - 6 input tokens (`max_req_input_len`)


def _input_too_long(ctx: Context) -> Finding | None:
    """SGLang rejected inputs longer than it allows (`Input length (N tokens) exceeds the maximum allowed length (M
    tokens)`, once per TP rank): M + INPUT_MARGIN is the context length or the KV pool, whichever is smaller."""
    known = [e for e in ctx.timeline.kind("input_too_long") if isinstance(e.fields.get("max_input_len"), int)]
    if not known:
        return None
    allowed = min(int(e.fields["max_input_len"]) for e in known)  # type: ignore[arg-type]
    longest = max(int(e.fields.get("input_len") or 0) for e in known)  # type: ignore[arg-type]
    requests = max(Counter(e.rank for e in known).values())  # NOTE: every TP rank logs each one
    cfg = ctx.config
    context, pool, limit = cfg.context_len, cfg.max_total_num_tokens, allowed + INPUT_MARGIN
    facts = {"allowed_input_tokens": allowed, "longest_input_tokens": longest, "context_len": context,
             "requests": requests}
    said = f"{requests} request{'s' if requests != 1 else ''} of up to {longest:,} tokens"
    rejected = f"{said} {'were' if requests != 1 else 'was'} rejected: the server allows {allowed:,} input tokens"
    if context is not None and (context <= pool if pool else limit >= context):
        return Finding(
            id="capacity.input_too_long", severity="warning",
            title="Inputs longer than the context length were rejected",
            message=f"{rejected}, as its context length ({context:,}) does.", evidence=evidence_events(known, **facts),
            ranks=_ranks(known),
            action="client: shorter inputs (or --allow-auto-truncate); a longer --context-length only if the model "
                   "supports it")
    where = (f"less than its context length ({context:,}) allows: its KV pool of {limit:,} tokens limits them"
             if context is not None else "the smaller of its context length and its KV pool")
    alternatives = (Change("kv_memory", direction=1),)
    if "fp8" not in cfg.kv_cache_dtype:
        alternatives += (Change("kv_dtype", cfg.fp8_kv),)
    return Finding(
        id="capacity.input_too_long", severity="warning", title="Inputs longer than the KV pool holds were rejected",
        message=f"{rejected}, {where}. A context length of {limit:,} says so to clients up front; longer inputs need "
        "more KV memory (a larger memory fraction, an fp8 KV cache, more GPUs).",
        evidence=evidence_events(known, **facts), change=Change("context", str(limit)),
        current=Current.of(context) if context is not None else None,
        tradeoff="Clients get the limit as an error before they send; a larger memory fraction leaves less headroom "
        "for activations, an fp8 KV cache costs slight accuracy.", ranks=_ranks(known), alternatives=alternatives,
        confidence="high" if context is not None else "medium")


def _ranks(events) -> tuple[str, ...]:
    return tuple(sorted({e.rank for e in events if e.rank}))


def _pool_bound(ctx: Context) -> Finding | None:
    steady = ctx.steady()
    if len(steady) < MIN_LINES:
        return _pool_bound_short(ctx)
    cfg = ctx.config
    size = request_size(steady, cfg.max_total_num_tokens)
    queued = steady.where(steady["queue_req"] > 0)
    full = queued.where(no_room(queued, cfg.max_total_num_tokens, size))
    fraction = len(full) / len(queued) if len(queued) else 0.0
    if fraction < BOUND_FRACTION or len(full) < MIN_FULL_LINES:
        return None
    change, current, tradeoff, alternatives = _memory_first(ctx, *_more_memory(ctx, _demand(full, size), size))
    why = (f"In {fraction:.0%} of {len(queued)} steady {ctx.load_word} lines with requests waiting the KV pool had "
           f"no room for the next one (median usage {full.median('usage'):.2f}, queue "
           f"{full.median('queue_req'):.0f}){_held(steady, cfg.max_total_num_tokens)}: memory, not the scheduler, "
           "limits the batch.")
    return Finding(
        id="capacity.pool_bound", severity="warning", title="KV pool full with requests waiting",
        message=f"{why} More KV memory, an fp8 KV cache ({cfg.flag('kv_dtype')} {cfg.fp8_kv}), or shorter outputs "
        "(the client's max_tokens) let more requests run.",
        evidence=evidence(full, len(queued), full_fraction=round(fraction, 3)), change=change, current=current,
        tradeoff=tradeoff, ranks=full.ranks, alternatives=alternatives,
        action=None if change else "client: lower max_tokens, or add GPUs (tensor parallelism)")


def _pool_bound_short(ctx: Context) -> Finding | None:
    """A short excerpt (fewer than MIN_LINES steady lines) whose load lines nearly all (SHORT_FRACTION) show a full
    pool and a queue: the same conclusion at `low` / `medium` confidence (low ones are `info`)."""
    load = ctx.load_or_none()
    tokens_in_pool = ctx.config.max_total_num_tokens
    full = load.where(waiting_at_full(load, tokens_in_pool)) if load is not None else None
    if load is None or full is None or len(full) < SHORT_FRACTION * len(load):
        ctx.steady_enough()  # notes why the load could not be judged
        return None
    size = request_size(load, tokens_in_pool)
    change, current, tradeoff, alternatives = _memory_first(ctx, *_more_memory(ctx, _demand(full, size), size))
    confidence = confidence_of(len(load), MIN_LINES)
    tokens = full.median("token") if "token" in full else float("nan")
    pool = f"; a pool of about {tokens / full.median('usage'):.0f} tokens" if tokens == tokens else ""
    lines = f"{len(load)} line{'s' if len(load) != 1 else ''}"
    return Finding(
        id="capacity.pool_bound", severity="info" if confidence == "low" else "warning",
        title="KV pool full with requests waiting",
        message=f"In {len(full)} of {len(load)} {ctx.load_word} lines the KV pool had no room for the next request "
        f"(usage median {full.median('usage'):.2f}{pool}) while {full.median('queue_req'):.0f} requests waited "
        f"(median): memory limits the batch. A short excerpt ({lines}): confirm on a longer log.",
        evidence=evidence(full, len(load), lines_read=len(load)), change=change, current=current, tradeoff=tradeoff,
        ranks=full.ranks, alternatives=alternatives,
        action=None if change else "client: lower max_tokens, or add GPUs (tensor parallelism)", confidence=confidence)


def _memory_first(ctx: Context, change: Change | None, current: Current | None,
                  tradeoff: str) -> tuple[Change | None, Current | None, str, tuple[Change, ...]]:
    """With the memory fraction not in the log, more KV memory (higher) comes first and an fp8 KV cache is the
    alternative: the log cannot say the fraction is already at its ceiling, where fp8 would be the next step. Not
    where the log shows little memory left after start-up (`gpu_memory.too_little`'s): there fp8 is the step."""
    cfg = ctx.config
    left = cfg.available_mem_gb
    if (change is None or change.idea != "kv_dtype" or cfg.mem_fraction_static is not None
            or (left is not None and left < LOW_GB)):
        return change, current, tradeoff, ()
    return (Change("kv_memory", direction=1), None,
            "Less headroom for activations (too high a value risks CUDA OOM); fp8 KV costs slight accuracy.", (change,))


def _held(rows: Rows, pool: int | None) -> str:
    """`; its P tokens hold N requests of the ~S tokens these grow to` where the pool and the size are known."""
    size = request_size(rows, pool) if pool else None
    if size is None:
        return ""
    return f"; its {pool:,} tokens hold {requests_held(pool, size)} requests of the ~{size:,.0f} tokens these grow to"


def _demand(bound: Rows, size: float | None) -> float | None:
    """The tokens the requests that wanted to run would hold: the running and the waiting requests at the
    DEMAND_QUANTILE of the bound lines, each at the size this log's requests grow to (`rules.room`); None where the
    size is unknown. NOTE: not the median: a burst that arrives together drains while the pool binds, so the median
    line counts the requests left, not the ones that came (tune_vs_search's tiny pool: 10 of 16, and a pool sized
    for 10 was bound again)."""
    if size is None or not len(bound):
        return None
    wanted = float(np.nanquantile(bound["running_req"] + bound["queue_req"], DEMAND_QUANTILE))
    return wanted * size if wanted > 0 else None


def _larger_cap(cfg: ServerConfig, demand: float | None, size: float | None) -> Change:
    """A hand-set pool cap raised to hold the demand, in the cap's own unit (tokens, or vLLM's blocks): the pool
    scaled by demand / pool, between MIN_GROWTH and MAX_GROWTH times; only "higher" where the demand is unknown.
    A running cap set by hand below what the larger pool holds comes along, raised to that many requests (the
    pool's room is of no use while the cap keeps the batch where it is)."""
    cap, pool = cfg.value("kv_cap"), cfg.max_total_num_tokens
    if not pool or demand is None or size is None:
        return Change("kv_cap", direction=1)
    growth = min(MAX_GROWTH, max(MIN_GROWTH, demand / pool))
    running_cap, holds = cfg.value("running_cap"), requests_held(int(pool * growth), size)
    along = (Change("running_cap", str(holds)),) if isinstance(running_cap, int) and 0 < running_cap < holds else ()
    return Change("kv_cap", str(math.ceil(cap * growth)), companions=along)


def _more_memory(ctx: Context, demand: float | None = None, size: float | None = None
                 ) -> tuple[Change | None, Current | None, str]:
    """(change, current, trade-off): more KV memory where there is some, else fp8 KV, else none (outputs).
    `demand`: the tokens the waiting and running requests would hold, `size` one request's (they size a pool capped
    by hand)."""
    cfg = ctx.config
    mfs = cfg.mem_fraction_static
    cap = cfg.value("kv_cap")
    if isinstance(cap, int) and cap > 0:  # NOTE: a pool sized by hand: that size binds, whatever memory is free
        return (_larger_cap(cfg, demand, size), Current.of(cap),
                "A larger pool takes memory from whatever the cap left it to; above what memory holds it fails to start.")
    if cfg.vllm:
        more = more_kv_memory(cfg)
        if more is not None:
            return (more, memory_fraction(cfg),
                    "Less memory left for activations and graphs: too high a value risks CUDA OOM.")
    avail, total = cfg.available_mem_gb, cfg.gpu_mem_gb
    if not cfg.vllm and mfs is not None and avail is not None and avail > SPARE_GB and total:
        return (Change("kv_memory", f"{min(0.95, mfs + (avail - TARGET_GB) / total):.3f}"), Current.of(mfs),
                "Less headroom for activations: too high a value risks CUDA OOM on the largest prefill.")
    if "fp8" not in cfg.kv_cache_dtype:
        return Change("kv_dtype", cfg.fp8_kv), Current.of(cfg.kv_cache_dtype), "Slight accuracy loss; check your evals."
    return None, None, "Shorter outputs change what users get; more GPUs cost money."


def _larger_pool(cfg) -> tuple[Change, ...]:
    """The pool's own cap set higher, where the log shows one set by hand."""
    cap = cfg.value("kv_cap")
    return (Change("kv_cap", direction=1),) if isinstance(cap, int) and cap > 0 else ()


def _pool_vs_context(ctx: Context) -> Finding | None:
    cfg = ctx.config
    pool, context = cfg.max_total_num_tokens, cfg.context_len
    if not pool or not context:
        ctx.cannot_judge("the KV pool size or the context length is not in the log")
        return None
    rows = ctx.timeline.kind("kv_capacity" if cfg.vllm else "pool")
    lines = tuple(e.line for e in rows[:3])
    fit = pool / context
    if cfg.vllm and cfg.max_concurrency is not None and abs(cfg.max_concurrency - fit) > CONCURRENCY_PRINTED:
        fit = cfg.max_concurrency  # NOTE: a hybrid model's KV tokens are not its per-request limit; vLLM's own count is
    holds = int(context * fit)  # tokens of full-context requests the cache holds (the pool's size, but for hybrids)
    facts = {"pool_tokens": pool, "context_len": context, "full_context_requests": round(fit, 2)}
    if fit < 1:
        suggested = max(1024, holds // 1024 * 1024) if holds >= 1024 else holds
        return Finding(
            id="capacity.context_exceeds_pool", severity="warning",
            title="One request at full context does not fit the KV pool",
            message=f"The KV pool holds {holds} tokens of a request but the context length is {context}: a request "
            "that long can never run (SGLang retracts or aborts it; vLLM refuses to start).",
            evidence=Evidence(count=len(rows), total=None, span=None, lines=lines, facts=facts),
            change=Change("context", str(suggested)), current=Current.of(context),
            tradeoff="Longer prompts are rejected; more KV memory instead keeps them.",
            alternatives=_larger_pool(cfg))
    wanted = cfg.value("running_cap")
    if not isinstance(wanted, int) or wanted <= fit:
        return None
    return Finding(
        id="capacity.pool_vs_concurrency", severity="info",
        title="The pool holds fewer full-context requests than asked for",
        message=f"The running cap is set to {wanted} requests of up to {context} tokens each, but the KV pool holds "
        f"{fit:.1f} requests at full context ({holds} tokens). Long requests will be retracted or wait.",
        evidence=Evidence(count=len(rows), total=None, span=None, lines=lines, facts={**facts, "asked": wanted}),
        change=None, current=Current.of(wanted),
        tradeoff="A lower cap runs fewer short requests at once too; a shorter context length rejects longer prompts.",
        alternatives=(Change("running_cap", str(max(1, int(fit)))), Change("context", str(holds // wanted))),
        action="if requests run long")
