"""`prefill_budget.capped` (SGLang): the prefill token budget (`--max-prefill-tokens`), not the chunk or memory,
ends each prefill batch while requests wait.

SGLang's admission ends a prefill batch at the first waiting request whose new tokens reach what is left of the
budget (the first request of a batch may exceed it; docs/log-formats.md §11). A batch so ended is below the
budget, and one more prompt of its mean length would reach it; or whole prompts filled it exactly (a benchmark's
prompts of one length: 8 x 2,048 = 16,384, sglang#7133). Trigger: among the prefill lines with a queue and the KV
pool below `ROOM` used, at least `CAPPED_FRACTION` ended so with `MIN_SEQS` requests or more, below the chunk
where the log prints it (a batch cut at the chunk is `prefill_chunk.too_small`'s; where the log does not print
it, a batch of a power of two tokens below the budget is read as cut at it) and below the running cap where
printed. The
budget is the log's `max_prefill_tokens`, else the era's default (`eras.default_max_prefill_tokens`); a batch of
several requests above that default proves the budget larger, and then nothing is judged. One line is evidence
already (`low` confidence: a short excerpt is judged, not dismissed).

Suggest the power of two that admits the median capped batch and one more prompt, at least twice the budget, at
most `MAX_BUDGET` and the chunk when the log prints a larger one.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.era_defaults import default_max_prefill_tokens
from toolkit.diagnose.findings import Current, Finding, confidence_of, evidence
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_least, power_of_two
from toolkit.diagnose.vocabulary import Change

ROOM = 0.9
CAPPED_FRACTION = 0.5
MIN_SEQS = 2  # requests in a batch for its mean prompt to say what the next one needs (one alone: a chunk cut?)
MAX_BUDGET = 65536


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg.vllm:
        return []
    prefill = ctx.timeline.series("prefill")
    if not len(prefill) or "new_token" not in prefill or "new_seq" not in prefill or "queue_req" not in prefill:
        return []
    budget = cfg.max_prefill_tokens or default_max_prefill_tokens(cfg.era)
    if budget is None:
        ctx.cannot_judge("the prefill token budget is neither in the log nor known for its era")
        return []
    seqs, tokens = prefill["new_seq"], prefill["new_token"]
    if cfg.max_prefill_tokens is None and bool(((seqs > 1) & (tokens > budget)).any()):
        return []  # NOTE: a batch of several requests above the default: the server runs a larger budget
    waiting = prefill.where((prefill["queue_req"] > 0) & (seqs >= 1) & (prefill["usage"] < ROOM))
    if not len(waiting):
        return []
    capped = waiting.where(_ended_by_budget(waiting, budget, cfg.chunked_prefill_size, cfg.max_running_requests))
    if len(capped) / len(waiting) < CAPPED_FRACTION:
        return []
    return [_finding(ctx, budget, capped, len(waiting))]


def _ended_by_budget(rows: Rows, budget: int, chunk: int | None, cap: int | None) -> np.ndarray:
    """Lines whose batch is below the budget (and the chunk) and would reach it with one more prompt of its mean
    length, or is the budget exactly (below a printed chunk), with room under the running cap."""
    tokens, seqs = rows["new_token"], rows["new_seq"]
    below = (tokens < budget) & (tokens + tokens / seqs >= budget)
    full = tokens == budget
    if chunk:
        below &= tokens < chunk
        full &= chunk > budget
    else:
        below &= ~power_of_two(tokens)  # NOTE: read as cut at a chunk the log does not print (chunks are so sized)
    ended = (seqs >= MIN_SEQS) & (below | full)
    if cap and "running_req" in rows:
        running = rows["running_req"]  # NOTE: NaN on a line that does not print it (a PD prefill server's)
        ended &= np.isnan(running) | (running + seqs < cap)
    return ended



def _finding(ctx: Context, budget: int, capped: Rows, waiting: int) -> Finding:
    cfg = ctx.config
    batch = float(np.median(capped["new_token"]))
    prompt = float(np.median(capped["new_token"] / capped["new_seq"]))
    ceiling = min(MAX_BUDGET, cfg.chunked_prefill_size) if (cfg.chunked_prefill_size or 0) > budget else MAX_BUDGET
    suggested = max(pow2_at_least(max(batch + prompt, 2 * budget), ceiling), budget)
    source = "" if cfg.max_prefill_tokens else " (SGLang's default; the log does not print it)"
    queued = float(np.median(capped["queue_req"]))
    confidence = confidence_of(len(capped), MIN_LINES)
    return Finding(
        id="prefill_budget.capped", severity="info" if confidence == "low" else "warning",
        title="The prefill token budget ends each prefill batch",
        message=f"{len(capped)} of {waiting} prefill batches with requests waiting stopped at about {batch:.0f} new "
        f"tokens with the KV pool below {ROOM:.0%} used: with one more prompt of about {prompt:.0f} tokens they would "
        f"reach or pass the budget of {budget} tokens{source}, so the next request waits a step while {queued:.0f} are "
        f"queued (median). A budget of {suggested} admits it.{_same_chunk(cfg.chunked_prefill_size, capped, budget)}",
        evidence=evidence(capped, waiting, budget=budget, median_batch_tokens=int(batch),
                          median_prompt_tokens=round(prompt, 1), median_queued=queued),
        change=Change("max_prefill", str(suggested)), current=Current.of(budget),
        tradeoff="Larger prefill batches make the decode steps that wait for them slower (higher ITL for running "
        "requests) and need more activation memory.", ranks=capped.ranks, confidence=confidence)


def _same_chunk(chunk: int | None, capped: Rows, budget: int) -> str:
    """Where batches filled the budget exactly and the log prints no chunk, a chunk of that size would cut them
    too."""
    if chunk or not bool((capped["new_token"] == budget).any()):
        return ""
    return (f" Batches of exactly {budget} tokens would also be cut by a chunked prefill of that size: where "
            f"--chunked-prefill-size is {budget}, raise it with the budget.")
