"""`prompt_limit.exceeded` (warning; vLLM V0): the scheduler dropped prompts longer than its prompt limit.

V0's scheduler checks each waiting prompt against its prompt limit and, where the prompt is longer, warns `Input
prompt (N tokens) is too long and exceeds limit of M` and finishes the request with no output (read as
`prompt_too_long`, docs/log-formats.md §9.5). It computes the limit so (`Scheduler._get_prompt_limit`):

- with chunked prefill running: the max model len (`--max-model-len`), as a prompt is prefilled in chunks of the
  step budget;
- without it: min(max model len, the step budget `--max-num-batched-tokens`), as the whole prompt is prefilled in
  one step. Chunked prefill can be asked for and still not run: 0.7 turns it on with a budget of 2,048 for a max
  model len above 32K, and a model that cannot chunk (MLA) then runs without it at that budget.

Which flag set M is read from the engine's config where the log shows it (its `Initializing an LLM engine ...
max_seq_len=N, ...` line, `max_num_batched_tokens` in the arguments or the launch command, whether chunked prefill
is on): the max model len where it equals M; the budget where it equals M below the max model len, or where the
max model len is known and above M (only the budget, or a chunked prefill that did not run, limits below it). The
advice raises that flag: the budget to the max model len where that is known (the limit is then the model's), else
higher; the max model len higher (the model's own context bounds it; the prompt, N, is what it needs). Where the log
shows neither value, one finding names both flags, raising each, and says that enabling chunked prefill also lifts
a budget limit. A dropped request is a problem to fix, not a crash: the engine serves on.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, evidence_events
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import Change

KIND = "prompt_too_long"


def check(ctx: Context) -> list[Finding]:
    dropped = [e for e in ctx.timeline.kind(KIND) if isinstance(e.fields.get("prompt_limit"), int)]
    if not dropped:
        return []
    limit = min(int(e.fields["prompt_limit"]) for e in dropped)  # type: ignore[arg-type]
    longest = max(int(e.fields.get("prompt_len") or 0) for e in dropped)  # type: ignore[arg-type]
    cfg = ctx.config
    model_len, budget, chunked = cfg.context_len, cfg.chunked_prefill_size, chunked_prefill(ctx)
    setters = limit_setters(limit, model_len, budget, chunked)
    n = len(dropped)
    said = (f"{n} prompt{'s' if n != 1 else ''} of up to {longest:,} tokens {'were' if n != 1 else 'was'} dropped: "
            f"vLLM's prompt limit is {limit:,} tokens, and a longer prompt finishes with no output")
    facts = {"prompt_limit": limit, "longest_prompt_tokens": longest, "requests": n, "max_model_len": model_len,
             "max_num_batched_tokens": budget,
             "chunked_prefill": None if chunked is None else str(chunked).lower(), "set_by": "+".join(setters)}
    proof = evidence_events(dropped, **facts)
    ranks = tuple(sorted({e.rank for e in dropped if e.rank}))
    tradeoff = ("A max model len above the model's own context (its max_position_embeddings) needs "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN and may degrade output; a step budget of a whole long prompt makes "
                "that step slow (decoding waits behind it) and needs activation memory for its tokens.")
    if setters == ("context",):
        return [Finding(
            id="prompt_limit.exceeded", severity="warning", title="Prompts longer than the max model len were dropped",
            message=f"{said}, the max model len{_chunk_note(chunked)}. A max model len of at least {longest:,} "
            "admits them where the model's context allows it; else the client must send shorter prompts.",
            evidence=proof, change=Change("context", direction=1), current=Current.of(limit, "the max model len"),
            tradeoff=tradeoff, ranks=ranks, confidence="high")]
    if setters == ("prefill_budget",):
        to = Change("prefill_budget", str(model_len)) if model_len is not None and model_len > limit else None
        return [Finding(
            id="prompt_limit.exceeded", severity="warning",
            title="Prompts longer than the step budget were dropped (no chunked prefill)",
            message=f"{said}, the step budget (max_num_batched_tokens): without chunked prefill a prompt is "
            f"prefilled in one step, so the limit is min(max model len"
            f"{f' {model_len:,}' if model_len is not None else ''}, budget). A budget of the max model len "
            "(or chunked prefill, where the model supports it) admits prompts up to the model len.",
            evidence=proof, change=to or Change("prefill_budget", direction=1),
            current=Current.of(budget if budget is not None else limit, "the step budget"), tradeoff=tradeoff,
            ranks=ranks, confidence="high")]
    return [Finding(
        id="prompt_limit.exceeded", severity="warning", title="Prompts longer than vLLM's prompt limit were dropped",
        message=f"{said}. V0's limit is the max model len, or without chunked prefill min(max model len, step budget "
        f"max_num_batched_tokens); the log does not show which of them is {limit:,}: raise the one that is "
        "(enabling chunked prefill, where the model supports it, also lifts a budget limit).",
        evidence=proof, change=Change("context", direction=1),
        alternatives=(Change("prefill_budget", direction=1),), tradeoff=tradeoff, ranks=ranks, confidence="medium")]


def limit_setters(limit: int, model_len: int | None, budget: int | None, chunked: bool | None) -> tuple[str, ...]:
    """The ideas whose flag set V0's prompt limit `limit`, from what the log shows of the max model len, the step
    budget and chunked prefill (None where it shows nothing): `context`, `prefill_budget`, or both where it cannot
    tell them apart (or its numbers fit neither)."""
    both = ("context", "prefill_budget")
    if model_len is not None:
        if model_len > limit:
            return ("prefill_budget",)  # NOTE: only the budget limits below the model len (chunked prefill not run)
        if model_len < limit:
            return both  # NOTE: a limit the config does not explain (a long-context LoRA's own length)
        # the model len is the limit: so is a budget equal to it, unless chunked prefill runs and lifts the budget's
        return both if budget == limit and chunked is not True else ("context",)
    if budget is not None:
        # a budget equal to the limit set it (an asked-for chunked prefill that did not run included); any other
        # budget did not (above the limit, it is not the min; below it, chunked prefill runs): the model len did
        return ("prefill_budget",) if budget == limit else ("context",)
    return ("context",) if chunked else both


def chunked_prefill(ctx: Context) -> bool | None:
    """Whether the log says chunked prefill is on (V0's `Chunked prefill is enabled ...`, else the arguments:
    `ServerConfig.chunked_prefill`), None where it says nothing."""
    if ctx.timeline.kind("scheduler_config"):
        return True
    return ctx.config.chunked_prefill


def _chunk_note(chunked: bool | None) -> str:
    return " (chunked prefill is on, so the step budget does not limit it)" if chunked else ""
