"""`usage.low_while_queued`: requests wait although the KV pool has room: admission, not memory, holds them.

Trigger: among steady load lines with a queue and the running batch below 95% of its cap (so the cap is not the
reason; when fewer than half the lines with a queue are below it, the cap is: no finding), >= 50% show a KV pool
with room for the next request (`rules.room`: what is left holds one more request of the running ones' size; a
pool of 1,024 tokens that holds two requests of this log's size has none while two run), retractions are not frequent,
and the pool is full on fewer than a third of those lines (where it fills that often it binds the batch, and its room
is the trough between waves of requests that finish together: `capacity.pool_bound`'s).
- SGLang: `token usage` excludes the evictable radix cache, which admission counts as free, so low usage with a
  queue means the admission estimate (`new_token_ratio`, scaled by `--schedule-conservativeness`) held requests
  back. Suggest 0.3 (half the current value when it is <= 0.5, at least 0.1); at 0.1 or below there is nothing
  lower to suggest, so no finding.
- vLLM: the per-step budgets limit the batch: `--max-num-batched-tokens` (tokens scheduled per step; raise it to
  twice its value, at least 8192) when the running batch is below `--max-num-seqs`.

Where an SGLang log has fewer than 10 steady decode lines but 10 or more prefill lines (requests that stop after a
few tokens), the prefill lines are read instead (they print the running requests, the queue and the usage too):
those not cut at the chunk and with more requests waiting than running.

`usage.prefill_bound`: a short excerpt (fewer than 10 queued steady lines) whose every load line has >= 100
requests waiting at a KV usage <= 0.1: the prefill budget limits admission. Raise it to twice its value, at least
8192 (SGLang `--chunked-prefill-size`, with `--max-prefill-tokens` when that is lower; vLLM
`--max-num-batched-tokens`), at `low` confidence (1-3 lines, `info`) or `medium` (4-9).
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, confidence_of, evidence
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.rules.retraction import FREQUENT_PER_MIN
from toolkit.diagnose.rules.room import has_room, no_room, request_size
from toolkit.diagnose.vocabulary import Change

LOW_FRACTION = 0.5
# NOTE: requests of one length finish in the same step and free their room one step before the queue's next ones are
# admitted: a pool that binds the batch shows room with a queue on the lines between its waves (vLLM-CPU, 9 blocks:
# 4 running at 100 % on half the queued lines, 2 at 50 % on the other half). Full on this share of the queued lines,
# the pool is the limit, not admission or the step budget.
POOL_FILLS = 1 / 3
SUGGESTED = 0.3
MIN_SUGGESTED = 0.1
MIN_BATCHED_TOKENS = 8192
BELOW_CAP_SHARE = 0.5  # of the steady lines with a queue, at least this share below the cap
LONG_QUEUE = 100  # a short excerpt: hundreds waiting ...
EMPTY_USAGE = 0.1  # ... at a nearly empty pool


def check(ctx: Context) -> list[Finding]:
    steady = _load_lines(ctx)
    queued = steady.where(steady["queue_req"] > 0)
    cap = ctx.config.max_running_requests
    if cap:
        with_queue = len(queued)
        queued = queued.where(queued["running_req"] < 0.95 * cap)
        if with_queue and len(queued) < BELOW_CAP_SHARE * with_queue:
            return []  # NOTE: mostly at the cap: the cap held the queue (running_cap's finding), not admission
    if len(queued) < MIN_LINES:
        short = _prefill_bound_short(ctx)
        if short is None:
            ctx.cannot_judge(f"{len(queued)} steady {ctx.load_word} lines with a queue below the running cap "
                             f"(needs {MIN_LINES})")
        return [short] if short is not None else []
    pool = ctx.config.max_total_num_tokens
    size = request_size(steady, pool)
    low = queued.where(has_room(queued, pool, size))
    fraction = len(low) / len(queued)
    _, rate, _ = ctx.retraction_rate()
    if fraction < LOW_FRACTION or (rate is not None and rate > FREQUENT_PER_MIN):
        return []
    if queued.fraction(no_room(queued, pool, size)) >= POOL_FILLS:
        return []  # NOTE: the pool binds the batch (capacity.pool_bound's); its room is the trough between waves
    usage = low.median("usage")
    where = (f"In {fraction:.0%} of {len(queued)} steady {ctx.load_word} lines with a queue, the KV pool had room "
             f"for the next request (usage median {usage:.2f}, queue median {low.median('queue_req'):.0f}).")
    if ctx.config.vllm:
        return [_vllm(ctx, low, queued, where, usage)]
    current = ctx.config.schedule_conservativeness
    if current <= MIN_SUGGESTED:
        return []
    suggested = SUGGESTED if current > 0.5 else round(max(MIN_SUGGESTED, current / 2), 2)
    return [Finding(
        id="usage.low_while_queued", severity="warning", title="Requests queued while the KV pool had room",
        message=f"{where} Admission reserves room for every running request's remaining output; a lower "
        "conservativeness admits more.",
        evidence=evidence(low, len(queued), median_usage=round(usage, 3)),
        change=Change("admission", f"{suggested:g}"), current=Current.of(current),
        tradeoff="Admitting more can run the pool out during decode: watch for retractions.",
        ranks=low.ranks,
    )]


def _load_lines(ctx: Context) -> Rows:
    """The steady load lines; on SGLang, the prefill lines where they are more than MIN_LINES and the decode lines
    fewer (requests that end after a few tokens leave few decode lines: every 40th step prints one), as each prints
    the running requests, the queue and the usage too."""
    steady = ctx.steady()
    if ctx.config.vllm or len(steady) >= MIN_LINES:
        return steady
    prefill = ctx.timeline.series("prefill")
    if len(prefill) < MIN_LINES or not all(name in prefill for name in ("running_req", "queue_req", "usage", "new_token")):
        return steady
    # NOTE: not a step cut at the chunk (the chunk paced it: prefill_chunk's), and more waiting than running (a few
    # arrivals between two long steps of a large batch are no admission holding requests back)
    chunk = ctx.config.chunked_prefill_size or 0
    held = (prefill["queue_req"] >= prefill["running_req"]) & ~((chunk > 0) & (prefill["new_token"] >= chunk))
    return prefill.where(held) if int(held.sum()) >= MIN_LINES else steady


def _prefill_bound_short(ctx: Context) -> Finding | None:
    """A short excerpt whose every load line has hundreds queued at a nearly empty pool: the prefill budget, not
    memory, limits admission."""
    load = ctx.load_or_none()
    if load is None:
        return None
    waiting = load.where((load["queue_req"] >= LONG_QUEUE) & (load["usage"] <= EMPTY_USAGE))
    if len(waiting) < len(load):
        return None
    cfg = ctx.config
    current = cfg.chunked_prefill_size
    suggested = max(MIN_BATCHED_TOKENS, 2 * current) if current else 2 * MIN_BATCHED_TOKENS
    both = not cfg.vllm and cfg.max_prefill_tokens is not None and cfg.max_prefill_tokens < suggested
    companions = (Change("max_prefill", str(suggested)),) if both else ()
    change = Change("prefill_budget", str(suggested), companions=companions)
    confidence = confidence_of(len(load), MIN_LINES)
    return Finding(
        id="usage.prefill_bound", severity="info" if confidence == "low" else "warning",
        title="Hundreds queued at a nearly empty pool",
        message=f"Every one of {len(load)} {ctx.load_word} line{'s' if len(load) != 1 else ''} shows "
        f"{load.median('queue_req'):.0f} requests waiting (median) with the KV pool at most {EMPTY_USAGE:.0%} used: "
        f"memory is free, so the tokens admitted per prefill step ({cfg.flag('prefill_budget')}) limit how fast the "
        "queue drains. A short excerpt (a burst being admitted looks the same for a few seconds): confirm on a "
        "longer log.",
        evidence=evidence(load, len(load), median_queue=load.median("queue_req"),
                          median_usage=round(load.median("usage"), 3)),
        change=change, current=Current.of(current) if current else None,
        tradeoff="Larger prefill steps make the decode steps that share them slower (higher ITL) and need more "
        "activation memory.", ranks=load.ranks, confidence=confidence)


def _vllm(ctx: Context, low, queued, where: str, usage: float) -> Finding:
    current, said = _step_budget(ctx.config)
    suggested = max(MIN_BATCHED_TOKENS, 2 * current) if current else MIN_BATCHED_TOKENS * 2
    return Finding(
        id="usage.low_while_queued", severity="warning", title="Requests waited while the KV cache had room",
        message=f"{where} The scheduler's per-step token budget, not memory, kept them waiting: each step schedules at "
        f"most {ctx.config.flag('prefill_budget')} tokens of prefill and decode.",
        evidence=evidence(low, len(queued), median_usage=round(usage, 3)),
        change=Change("prefill_budget", str(suggested)),
        current=said,
        tradeoff="Larger steps prefill more per step: decode steps that share them take longer (higher ITL).",
        ranks=low.ranks,
    )


def _step_budget(cfg) -> tuple[int | None, Current | None]:
    """The tokens a step schedules now: `max_num_batched_tokens`, else what speculative decoding's draft slots leave
    of it (vLLM's `max_num_scheduled_tokens is set to N` warning; the flag itself is then above N). Where only the
    cut is known the suggestion starts from it, at least twice MIN_BATCHED_TOKENS (the flag's value is unknown)."""
    if cfg.chunked_prefill_size:
        return cfg.chunked_prefill_size, Current.of(cfg.chunked_prefill_size)
    cut = cfg.scheduled_tokens
    if not cut:
        return None, None
    return max(cut, MIN_BATCHED_TOKENS), Current.of(cut, "max_num_scheduled_tokens, after speculative decoding's slots")
