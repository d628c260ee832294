"""`speculative.low_acceptance` (info): speculative decoding drafts tokens the target model mostly rejects, so
the verify step pays for drafts that do not come back as output.

Read from SGLang's decode lines (`accept len`, `accept rate`: accepted tokens per drafted token, the bonus token
included) or vLLM's `SpecDecoding metrics` (`Mean acceptance length`, `Draft acceptance rate`). Trigger: at
least `MIN_RECORDS` lines or records with a rate, and a median rate below `LOW_RATE`. Suggest drafting about what
is accepted: SGLang `--speculative-num-draft-tokens` ceil(accept length) + 1 (or fewer `--speculative-num-steps`,
`--speculative-eagle-topk 1`); vLLM `num_speculative_tokens` ceil(accept length - 1), at least 1.
"""
from __future__ import annotations

import math

import numpy as np

from toolkit.diagnose.findings import Evidence, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.ideas import Change
from toolkit.diagnose.rules.context import MIN_LINES, Context

LOW_RATE = 0.3
MIN_RECORDS = 3


def check(ctx: Context) -> list[Finding]:
    if ctx.config.vllm:
        records = [e for e in ctx.timeline.kind("spec_metrics") if _number(e.fields.get("accept_rate")) is not None]
        rates = [float(e.fields["accept_rate"]) for e in records]  # type: ignore[arg-type]
        lengths = [x for e in records if (x := _number(e.fields.get("accept_len"))) is not None]
        ranks = tuple(sorted({e.rank for e in records}))
        return _judge(ctx, rates, lengths, evidence_events(records), ranks, "SpecDecoding records")
    load = ctx.timeline.load()
    if "accept_rate" not in load:
        return []
    rows = load.where(np.isfinite(load["accept_rate"]))
    lengths = [x for x in rows["accept_len"].tolist() if x == x]
    return _judge(ctx, rows["accept_rate"].tolist(), lengths, evidence(rows), rows.ranks, "decode lines")


def _judge(ctx: Context, rates: list[float], lengths: list[float], ev: Evidence, ranks: tuple[str, ...],
           what: str) -> list[Finding]:
    if len(rates) < MIN_RECORDS:
        return []
    rate = float(np.median(rates))
    if rate >= LOW_RATE:
        return []
    length = float(np.median(lengths)) if lengths else None
    said = f", accepting {length:.2f} tokens per step" if length is not None else ""
    facts = {"median_accept_rate": round(rate, 3), "median_accept_len": length}
    return [Finding(
        "speculative.low_acceptance", "info", f"Speculative decoding accepts {rate:.0%} of its drafts",
        f"The median draft acceptance rate over {len(rates)} {what} is {rate:.2f}{said}: most drafted tokens are "
        "rejected, and verifying them costs target-model compute. Draft about what is accepted, or check the draft "
        "model and its chat template.",
        Evidence(ev.count, ev.total, ev.span, ev.lines, facts), _fewer_drafts(ctx, length), None,
        "Fewer drafts per step cap the speed-up when acceptance rises again (other prompts, another draft model).",
        ranks, _alternatives(ctx), confidence=confidence_of(len(rates), MIN_LINES))]


def _fewer_drafts(ctx: Context, length: float | None) -> Change:
    if length is None:
        return Change("spec_draft_tokens", direction=-1)
    if ctx.config.vllm:
        return Change("spec_draft_tokens", str(max(1, math.ceil(length - 1))))
    return Change("spec_draft_tokens", str(max(2, math.ceil(length) + 1)))


def _alternatives(ctx: Context) -> tuple[Change, ...]:
    return () if ctx.config.vllm else (Change("spec_steps", direction=-1), Change("spec_topk", "1"))


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
