"""`prefill_chunk.too_small`: the prefill chunk, not memory, paces admission (SGLang).

Trigger: `--chunked-prefill-size` C is in the log, at least MIN_PREFILLS prefill lines (steady ones when there are
enough, else all), and in >= CUT_FRACTION of them the step was cut at the chunk (`#new-token` >= C) while the KV
pool had room (token usage < ROOM). Where the log does not print C, the lines may: `CUTS_SEEN` or more steps with a
queue of exactly one power of two of tokens (at least 64), one of them of several requests (a cut: prompts of that
length would come one a step), read as cut at a chunk of that size (sglang#11648: 512 tokens a DP rank, the chunk
divided over the ranks): info at low confidence, a chunk the log does not state. Each cut line leaves its last request's prompt to the next step, so prompts
longer than C take several steps and everyone queued behind them waits.

Where nearly every steady decode line (`DRAINED_FRACTION`) shows no queue, the prefill lines' queues were bursts
admitted within a few steps (a closed-loop client whose requests end and arrive together): no `too_small` (a tiny
chunk is still one, below).

`prefill_chunk.tiny` (SGLang): a `--chunked-prefill-size` below `TINY_CHUNK` in the log (sglang#3713 ran with 64):
every prompt takes one forward pass per chunk, whatever the load; raise it to `TINY_CHUNK` x 4 (info; the
evidence is the line that prints it and the prefill lines cut at it), where `too_small` has no finding to give.

The size comes from the evidence: a prompt's mean length is the prefill tokens (new + cached) over the requests
admitted (`#new-seq` summed, less one per cut: the cut request is counted again in the step that finishes it), and
the chunk suggested is the power of two that holds the median cut line's waiting prompts (queued + the cut one) at
that mean length — at least 2 C, at most MAX_CHUNK and the pool's size. vLLM prints no prefill lines; its token
budget is judged from its stats lines (`usage.low_while_queued`).
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import MAX_LINES as MAX_EVIDENCE_LINES
from toolkit.diagnose.findings import Current, Evidence, Finding, confidence_of, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_least, power_of_two
from toolkit.diagnose.vocabulary import Change

MIN_PREFILLS = 5
CUT_FRACTION = 0.5
ROOM = 0.9
MAX_CHUNK = 16384  # SGLang's own default chunk on its largest GPUs (mineru#3303: 8,192 a step with 60 queued)
TINY_CHUNK = 512
CUTS_SEEN = 3
MIN_SEEN_CHUNK = 64
DRAINED_FRACTION = 0.9  # of the steady decode lines with no queue: the prefill lines' queues were bursts


def check(ctx: Context) -> list[Finding]:
    chunk = ctx.config.chunked_prefill_size
    if ctx.config.vllm:
        return []
    if not chunk or chunk <= 0:
        seen = _chunk_in_the_lines(ctx)
        return _too_small(ctx, seen)[0] if seen else []
    why = None
    if not _queue_never_stays(ctx):  # NOTE: else the prefill lines' queue is a burst drained before decode resumed
        found, why = _too_small(ctx, chunk)
        if found:
            return found
    tiny = _tiny(ctx, chunk) if chunk < TINY_CHUNK else None
    if tiny is not None:
        return [tiny]
    if why is not None:
        ctx.cannot_judge(why)
    return []


def _queue_never_stays(ctx: Context) -> bool:
    """Enough decode lines, nearly all with nothing queued: the requests a prefill line shows waiting were a burst
    (a closed-loop client's requests, all ending and arriving together) that its few chunked steps admitted; the
    chunk paced nothing that waited long."""
    steady = ctx.steady()
    return len(steady) >= MIN_LINES and steady.fraction(steady["queue_req"] == 0) >= DRAINED_FRACTION


def _chunk_in_the_lines(ctx: Context) -> int | None:
    """The chunk the prefill lines show where the log does not print it (the module's docstring), or None."""
    prefill = ctx.timeline.series("prefill")
    if not len(prefill) or "new_token" not in prefill or "new_seq" not in prefill or "queue_req" not in prefill:
        return None
    queued = prefill.where(prefill["queue_req"] > 0)
    tokens = queued["new_token"]
    sizes, counts = np.unique(tokens[power_of_two(tokens) & (tokens >= MIN_SEEN_CHUNK)], return_counts=True)
    for size in sizes[counts >= CUTS_SEEN][::-1].tolist():
        if bool(((tokens == size) & (queued["new_seq"] >= 2)).any()):
            return int(size)
    return None


def _too_small(ctx: Context, chunk: int) -> tuple[list[Finding], str | None]:
    """The finding, or why it could not be judged."""
    prefill = ctx.timeline.series("prefill", "steady")
    if len(prefill) < MIN_LINES:
        prefill = ctx.timeline.series("prefill")
    if len(prefill) < MIN_PREFILLS or "new_token" not in prefill:
        return [], f"{len(prefill)} prefill lines (needs {MIN_PREFILLS})"
    cut = prefill.where((prefill["new_token"] >= chunk) & (prefill["usage"] < ROOM))
    if len(cut) / len(prefill) < CUT_FRACTION:
        return [], None
    prompt = mean_prompt_tokens(prefill, len(cut))
    if prompt is None:
        return [], None
    waiting = float(np.nanmedian(cut["queue_req"])) + 1 if "queue_req" in cut else 1.0
    suggested = suggested_chunk(chunk, waiting * prompt, ctx.config.max_total_num_tokens)
    if suggested <= chunk:
        return [], None
    return [_finding(ctx, chunk, suggested, cut, len(prefill), prompt, waiting)], None


def mean_prompt_tokens(prefill, cuts: int) -> float | None:
    """Prefill tokens (new + cached) per admitted request; None when no request can be counted."""
    seqs = float(np.nansum(prefill["new_seq"])) - cuts if "new_seq" in prefill else 0.0
    tokens = float(np.nansum(prefill["new_token"]))
    if "cached_token" in prefill:
        tokens += float(np.nansum(prefill["cached_token"]))
    return tokens / seqs if seqs >= 1 and tokens > 0 else None


def suggested_chunk(chunk: int, demand_tokens: float, pool: int | None) -> int:
    """The power of two that holds `demand_tokens`, at least 2x the chunk, at most MAX_CHUNK and the pool."""
    cap = MAX_CHUNK if not pool else min(MAX_CHUNK, 2 ** int(np.log2(pool)))
    return pow2_at_least(max(demand_tokens, 2 * chunk), cap)


def _budget_along(ctx: Context, suggested: int) -> tuple[Change, ...]:
    """`--max-prefill-tokens` raised along with the chunk where the log's is lower (it would bound the step)."""
    budget = ctx.config.max_prefill_tokens
    return (Change("max_prefill", str(suggested)),) if budget is not None and budget < suggested else ()


def _finding(ctx: Context, chunk: int, suggested: int, cut, total: int, prompt: float, waiting: float) -> Finding:
    companions = _budget_along(ctx, suggested)
    seen = "" if ctx.config.chunked_prefill_size else " (read from the lines: the log does not print it)"
    confidence = confidence_of(total, MIN_LINES) if not seen else "low"
    return Finding(
        id="prefill_chunk.too_small", severity="info" if confidence == "low" else "warning",
        title="The prefill chunk paces admission",
        message=f"{len(cut)} of {total} prefill steps were cut at the chunk of {chunk} tokens{seen} with the KV pool "
        f"below {ROOM:.0%} used: prompts average about {prompt:.0f} tokens, so each takes several steps and the "
        f"{waiting - 1:.0f} queued behind the cut one (median) wait for them. {suggested} tokens holds those "
        "prompts in one step.",
        evidence=evidence(cut, total, chunk=chunk, mean_prompt_tokens=round(prompt, 1), median_waiting=waiting),
        change=Change("prefill_budget", str(suggested), companions=companions),
        current=Current.of(chunk) if not seen else None,
        tradeoff="Larger prefill steps make the decode steps that share them slower (higher ITL for running requests) "
        "and need more activation memory.", ranks=cut.ranks, confidence=confidence)


def _tiny(ctx: Context, chunk: int) -> Finding | None:
    suggested = suggested_chunk(chunk, 4 * TINY_CHUNK, ctx.config.max_total_num_tokens)
    if suggested <= chunk:
        return None  # NOTE: a pool this small holds no larger chunk
    prefill = ctx.timeline.series("prefill")
    cut = prefill.where(prefill["new_token"] >= chunk) if "new_token" in prefill else prefill.head(0)
    printed = next((e for kind in ("server_args", "pool") for e in ctx.timeline.kind(kind)
                    if "chunked_prefill_size" in e.fields), None)
    lines = {*cut.head(MAX_EVIDENCE_LINES)["line"].astype(int).tolist(), *([printed.line] if printed else [])}
    return Finding(
        id="prefill_chunk.tiny", severity="info", title=f"A prefill chunk of {chunk} tokens",
        message=f"{ctx.config.flag('prefill_budget')} is {chunk}: every prompt is prefilled {chunk} tokens per forward "
        f"pass, so a 1,000-token prompt takes {-(-1000 // chunk)} steps before its first token"
        + (f" ({len(cut)} of {len(prefill)} prefill lines were cut at it)." if len(prefill) else ".")
        + f" {suggested} tokens keeps a prompt to a step or two.",
        evidence=Evidence(count=max(1, len(cut)), total=len(prefill) or None, span=None, lines=tuple(sorted(lines)),
                 facts={"chunk": chunk, "cut_lines": len(cut)}),
        change=Change("prefill_budget", str(suggested), companions=_budget_along(ctx, suggested)),
        current=Current.of(chunk),
        tradeoff="Larger prefill steps make the decode steps that share them slower (higher ITL for running requests).",
        ranks=cut.ranks if len(cut) else ())
