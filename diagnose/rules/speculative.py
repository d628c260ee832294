"""`speculative.low_acceptance` (info): speculative decoding drafts tokens the target model mostly rejects, so
the verify step pays for drafts that do not come back as output.

Read from SGLang's decode lines (`accept len`, `accept rate`: accepted tokens per drafted token, the bonus token
included) or vLLM's `SpecDecoding metrics` (`Mean acceptance length`, `Draft acceptance rate`; V0's `Speculative
metrics` count since start-up). Trigger: a rate below `LOW_RATE`, over all the drafted tokens where the log counts
them (else the median of the lines), on one line or more; the confidence grows with those tokens (else with the
lines). Suggest drafting about what is accepted: SGLang `--speculative-num-draft-tokens` ceil(accept length) + 1
(or fewer `--speculative-num-steps`, `--speculative-eagle-topk 1`); vLLM `num_speculative_tokens` of
`--speculative-config` (V0: `--num-speculative-tokens`) ceil(accept length - 1), at least 1.

`speculative.batch_compute_bound` (warning, vLLM V1): speculation on a batch so large that decode is compute-bound.
A step verifies k drafts plus one token for each running sequence and emits the mean acceptance length L of them:
while a step's time is set by reading the weights (a small batch) those extra tokens are nearly free and a step
yields L tokens instead of one; once running x (k + 1) tokens per step pass `COMPUTE_BOUND_TOKENS` the step's time
grows with its tokens, so throughput is about L / (k + 1) of what it is without speculation: slower whenever drafts
are rejected. k is read from the records themselves (V1 counts accepted and drafted tokens per interval and prints
the mean acceptance length: k = (L - 1) / rate), the batch from the stats line printed with each record. Trigger: at
least `MIN_BIG_STEPS` records on such batches with L / (k + 1) below `NEAR_FULL` (near-perfect drafting loses
little). Suggest drafting what is accepted (the low-acceptance rule's value) or no speculation at that concurrency.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from toolkit.diagnose.findings import Confidence, Current, Evidence, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.vocabulary import Change

LOW_RATE = 0.3
# tokens verified per decode step from which a GPU's matmuls are compute-bound, not weight-read-bound: dense bf16
# weights turn at a few hundred tokens, fp8 at about twice that, MoE later; set high so only clear cases count
COMPUTE_BOUND_TOKENS = 1024
MIN_BIG_STEPS = 2     # speculative-decoding records on compute-bound batches before the batch rule judges
NEAR_FULL = 0.75      # accepted over verified tokens per step (L / (k + 1)) from which speculation loses little
PAIRED_SECONDS = 1.0  # a stats line and the SpecDecoding record printed with it are this close in time
SOME_DRAFTS, MANY_DRAFTS = 100, 1000  # drafted tokens behind a rate: `medium`, `high` confidence from these on


class Rates(NamedTuple):
    """What the log says of acceptance: the rate (accepted per drafted token), the mean acceptance length (tokens
    per step, the bonus token included; None when not printed), how many lines or records say it, the drafted
    tokens they count (None when not printed), and the evidence."""

    rate: float
    length: float | None
    records: int
    drafted: int | None
    evidence: Evidence
    v0: bool = False  # read from vLLM V0's `Speculative metrics`: that vLLM names the knob its own way


def check(ctx: Context) -> list[Finding]:
    if ctx.config.vllm:
        records = [e for e in ctx.timeline.kind("spec_metrics") if _number(e.fields.get("accept_rate")) is not None]
        rates = _vllm_rates(records)
        ranks = tuple(sorted({e.rank for e in records}))
        low = _judge(ctx, rates, ranks, "speculative-decoding metrics line") if rates is not None else []
        return low + _compute_bound(ctx, records)
    load = ctx.timeline.load()
    if "accept_rate" not in load:
        return []
    rows = load.where(np.isfinite(load["accept_rate"]))
    if not len(rows):
        return []
    lengths = [x for x in rows["accept_len"].tolist() if x == x]
    rates = Rates(float(np.median(rows["accept_rate"])), float(np.median(lengths)) if lengths else None, len(rows),
                  None, evidence(rows))
    return _judge(ctx, rates, rows.ranks, "decode line")


def _vllm_rates(records: list[Event]) -> Rates | None:
    """vLLM V1's `SpecDecoding metrics` count each interval's accepted and drafted tokens: the rate over all the
    records that print them. V0's `Speculative metrics` count since start-up: each engine's (source and rank)
    latest record, summed; its mean acceptance length is the emitted tokens per step (`Number of draft tokens` / k
    steps). Else the median rate of the records."""
    if not records:
        return None
    v0 = [e for e in records if _number(e.fields.get("number_of_draft_tokens"))]
    if v0:
        # NOTE: cumulative counts only grow within an engine's run: its record with the most drafts is its latest
        by_drafts = sorted(v0, key=lambda e: _count(e, "number_of_draft_tokens"))
        used = list({(e.source, e.rank): e for e in by_drafts}.values())
        drafted = sum(_count(e, "number_of_draft_tokens") for e in used)
        accepted = sum(_count(e, "number_of_accepted_tokens") for e in used)
        steps = sum(_count(e, "number_of_draft_tokens") / k for e in used
                    if (k := _count(e, "number_of_speculative_tokens")))
        emitted = sum(_count(e, "number_of_emitted_tokens") for e in used)
        length = emitted / steps if steps and emitted else None
        return Rates(accepted / drafted, length, len(used), int(drafted), evidence_events(used), v0=True)
    lengths = [x for e in records if (x := _number(e.fields.get("accept_len"))) is not None]
    length = float(np.median(lengths)) if lengths else None
    counted = [e for e in records if _count(e, "drafted") and _number(e.fields.get("accepted")) is not None]
    if counted:
        drafted = sum(_count(e, "drafted") for e in counted)
        accepted = sum(_count(e, "accepted") for e in counted)
        return Rates(accepted / drafted, length, len(counted), int(drafted), evidence_events(counted))
    rate = float(np.median([float(e.fields["accept_rate"]) for e in records]))  # type: ignore[arg-type]
    return Rates(rate, length, len(records), None, evidence_events(records))


def _count(e: Event, name: str) -> float:
    return _number(e.fields.get(name)) or 0.0


def _judge(ctx: Context, rates: Rates, ranks: tuple[str, ...], noun: str) -> list[Finding]:
    if rates.rate >= LOW_RATE:
        return []
    length = rates.length
    said = f", accepting {length:.2f} tokens per step" if length is not None else ""
    drafts = f" ({rates.drafted:,} drafted tokens)" if rates.drafted is not None else ""
    facts = {"accept_rate": round(rates.rate, 3), "accept_len": length, "drafted_tokens": rates.drafted}
    ev = rates.evidence
    return [Finding(
        id="speculative.low_acceptance", severity="info",
        title=f"Speculative decoding accepts {rates.rate:.0%} of its drafts",
        message=f"The draft acceptance rate over {rates.records} {noun}{'s' if rates.records != 1 else ''}{drafts} is "
        f"{rates.rate:.2f}{said}: most drafted "
        "tokens are rejected, and verifying them costs target-model compute. Draft about what is accepted, or "
        "check the draft model and its chat template.",
        evidence=Evidence(count=ev.count, total=ev.total, span=ev.span, lines=ev.lines, facts=facts),
        change=_fewer_drafts(ctx, length, rates.v0), current=None,
        tradeoff="Fewer drafts per step cap the speed-up when acceptance rises again (other prompts, another draft "
        "model).", ranks=ranks, alternatives=_alternatives(ctx), confidence=_confidence(rates))]


def _confidence(rates: Rates) -> Confidence:
    """By the drafted tokens where the log counts them (a rate over thousands of drafts is sure even in two
    records), else by the lines, as load rules are."""
    if rates.drafted is None:
        return confidence_of(rates.records, MIN_LINES)
    return "high" if rates.drafted >= MANY_DRAFTS else "medium" if rates.drafted >= SOME_DRAFTS else "low"


def _fewer_drafts(ctx: Context, length: float | None, v0: bool) -> Change:
    idea = "spec_draft_tokens_v0" if v0 else "spec_draft_tokens"
    if length is None:
        return Change(idea, direction=-1)
    if ctx.config.vllm:
        return Change(idea, str(max(1, math.ceil(length - 1))))
    return Change("spec_draft_tokens", str(max(2, math.ceil(length) + 1)))


def _alternatives(ctx: Context) -> tuple[Change, ...]:
    return () if ctx.config.vllm else (Change("spec_steps", direction=-1), Change("spec_topk", "1"))


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class BigStep(NamedTuple):
    """A V1 SpecDecoding record on a compute-bound batch: the running batch of its stats line, the draft positions
    k, the mean acceptance length, and the tokens a step verifies."""

    record: Event
    running: float
    drafts: int
    length: float
    verified: float


def _compute_bound(ctx: Context, records: list[Event]) -> list[Finding]:
    big = [step for e in records if (step := _big_step(ctx, e)) is not None]
    if len(big) < MIN_BIG_STEPS:
        return []
    drafts = max(s.drafts for s in big)
    length = float(np.median([s.length for s in big]))
    yield_ = length / (drafts + 1)
    running = int(np.median([s.running for s in big]))
    facts = {"running_req": running, "draft_tokens": drafts, "accept_len": round(length, 2),
             "verified_tokens_per_step": int(np.median([s.verified for s in big])), "yield": round(yield_, 2)}
    events = [s.record for s in big]
    change = Change("spec_draft_tokens", str(max(1, math.ceil(length - 1)))) if math.ceil(length - 1) < drafts \
        else Change("spec_draft_tokens", direction=-1)
    return [Finding(
        id="speculative.batch_compute_bound", severity="warning",
        title=f"Speculative decoding on a {running}-request batch costs more than it saves",
        message=f"{running} requests decode together, each verifying {drafts} drafted tokens and one more per step: "
        f"about {facts['verified_tokens_per_step']:,} tokens a step, where decode is bound by compute, not by reading "
        f"the weights. A step then takes time in proportion to its tokens and yields {length:.2f} of every "
        f"{drafts + 1} ({yield_:.0%}): at this concurrency speculation slows decoding rather than speeding it.",
        evidence=evidence_events(events, **facts), change=change, current=Current.of(drafts, "read from the metrics"),
        tradeoff="Fewer drafts (or none) at this concurrency give up the speed-up a single user sees when the server "
        "is quiet.", ranks=tuple(sorted({e.rank for e in events})), action="or run without speculative decoding "
        "while the batch stays this large", confidence=confidence_of(len(big), MIN_LINES))]


def _big_step(ctx: Context, record: Event) -> BigStep | None:
    """`record` with its stats line's running batch, where it verifies at least `COMPUTE_BOUND_TOKENS` a step and
    yields less than `NEAR_FULL` of them; None otherwise (or where k or the batch cannot be read)."""
    rate, length = _number(record.fields.get("accept_rate")), _number(record.fields.get("accept_len"))
    if not rate or length is None or length <= 1:
        return None
    drafts = round((length - 1) / rate)
    running = _running_with(ctx, record)
    if drafts < 1 or running is None:
        return None
    verified = running * (drafts + 1)
    if verified < COMPUTE_BOUND_TOKENS or length / (drafts + 1) >= NEAR_FULL:
        return None
    return BigStep(record, running, drafts, length, verified)


def _running_with(ctx: Context, record: Event) -> float | None:
    """The running batch of the stats line printed with `record` (same rank, within `PAIRED_SECONDS`)."""
    if record.time is None:
        return None
    load = ctx.timeline.load()
    if "running_req" not in load:
        return None
    rows = load.of_rank(record.rank) if record.rank else load
    times, running = rows["time"], rows["running_req"]
    near = np.abs(times - record.time) <= PAIRED_SECONDS
    values = running[near & np.isfinite(running)]
    return float(values[-1]) if len(values) else None
