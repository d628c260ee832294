"""`usage.low_while_queued`: requests wait although the KV pool has room: admission, not memory, holds them.

Trigger: among steady load lines with a queue (and the running batch below 95% of its cap, so the cap is not
the reason), >= 50% show KV usage < 0.9, and retractions are not frequent.
- SGLang: `token usage` excludes the evictable radix cache, which admission counts as free, so low usage with a
  queue means the admission estimate (`new_token_ratio`, scaled by `--schedule-conservativeness`) held requests
  back. Suggest 0.3 (half the current value when it is <= 0.5, at least 0.1); at 0.1 or below there is nothing
  lower to suggest, so no finding.
- vLLM: the per-step budgets limit the batch: `--max-num-batched-tokens` (tokens scheduled per step; raise it to
  twice its value, at least 8192) when the running batch is below `--max-num-seqs`.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.flags import flag
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.rules.retraction import FREQUENT_PER_MIN

LOW_USAGE = 0.9
LOW_FRACTION = 0.5
SUGGESTED = 0.3
MIN_SUGGESTED = 0.1
MIN_BATCHED_TOKENS = 8192


def check(ctx: Context) -> list[Finding]:
    steady = ctx.steady()
    queued = steady.where(steady["queue_req"] > 0)
    cap = ctx.config.max_running_requests
    if cap:
        queued = queued.where(queued["running_req"] < 0.95 * cap)
    if len(queued) < MIN_LINES:
        ctx.cannot_judge(f"{len(queued)} steady {ctx.load_word} lines with a queue below the running cap "
                         f"(needs {MIN_LINES})")
        return []
    low = queued.where(queued["usage"] < LOW_USAGE)
    fraction = len(low) / len(queued)
    _, rate, _ = ctx.retraction_rate()
    if fraction < LOW_FRACTION or (rate is not None and rate > FREQUENT_PER_MIN):
        return []
    usage = low.median("usage")
    where = (f"In {fraction:.0%} of {len(queued)} steady {ctx.load_word} lines with a queue, KV usage was below "
             f"{LOW_USAGE} (median {usage:.2f}, queue median {low.median('queue_req'):.0f}).")
    if ctx.config.vllm:
        return [_vllm(ctx, low, queued, where, usage)]
    current = ctx.config.schedule_conservativeness
    if current <= MIN_SUGGESTED:
        return []
    suggested = SUGGESTED if current > 0.5 else round(max(MIN_SUGGESTED, current / 2), 2)
    return [Finding(
        "usage.low_while_queued", "warning", "Requests queued while the KV pool had room",
        f"{where} Admission reserves room for every running request's remaining output; a lower "
        "conservativeness admits more.",
        evidence(low, len(queued), median_usage=round(usage, 3)),
        flag="--schedule-conservativeness", suggested=f"{suggested:g}", current=f"{current:g}",
        tradeoff="Admitting more can run the pool out during decode: watch for retractions.",
        ranks=low.ranks,
    )]


def _vllm(ctx: Context, low, queued, where: str, usage: float) -> Finding:
    current = ctx.config.chunked_prefill_size
    suggested = max(MIN_BATCHED_TOKENS, 2 * current) if current else MIN_BATCHED_TOKENS * 2
    return Finding(
        "usage.low_while_queued", "warning", "Requests waited while the KV cache had room",
        f"{where} The scheduler's per-step token budget, not memory, kept them waiting: each step schedules at "
        "most --max-num-batched-tokens tokens of prefill and decode.",
        evidence(low, len(queued), median_usage=round(usage, 3)),
        flag=flag(ctx.config, "prefill_budget"), suggested=str(suggested),
        current=str(current) if current else None,
        tradeoff="Larger steps prefill more per step: decode steps that share them take longer (higher ITL).",
        ranks=low.ranks,
    )
