"""`prefill_budget.capped`: prefill batches ended by `--max-prefill-tokens` (the next prompt would reach what is
left of it) while requests wait and the pool has room, across each threshold, on synthetic lines and the corpus."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup
from tests.diagnose.test_rules import ARGS
from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Finding

ERA = "0.4.9"
RULE = "prefill_budget.capped"
CORPUS = Path(__file__).parent / "real_logs"


def prefills(batches: list[tuple[int, int]], *, queue: int = 40, usage: float = 0.1, running: int = 7,
             era: str = ERA) -> list[str]:
    """Only prefill lines (a pasted excerpt): `batches` of (#new-seq, #new-token), 1 s apart, running growing."""
    log = Log(era)
    for i, (seqs, tokens) in enumerate(batches):
        log.add(lf.prefill(era, new_seq=seqs, new_token=tokens, cached=0, running=running + 3 * i, queue=queue,
                           usage=usage), dt=1.0)
    return log.lines


def with_startup(batches: list[tuple[int, int]], *, chunk: int = 32768, max_prefill: int = 16384,
                 max_running: int = 4096, **kw) -> list[str]:
    """The same lines after a start-up that prints the chunk, the budget and the running cap."""
    start = Log(ERA).start(Startup(chunk=chunk, max_prefill=max_prefill, max_running=max_running),
                           **{**ARGS, "chunked_prefill_size": chunk, "max_prefill_tokens": max_prefill})
    return start.lines + prefills(batches, **kw)


def found(lines: list[str]) -> list[Finding]:
    return [f for f in analyze(lines=lines).findings if f.id == RULE]


@pytest.mark.parametrize("prompt,fires", [(5000, True), (4100, True), (4000, False)])
def test_a_batch_the_next_prompt_would_push_past_the_default_budget_is_capped(prompt: int, fires: bool) -> None:
    """Three prompts and a queue: 3 x 4,100 + 4,100 reaches 16,384 (SGLang's default, not printed), so the fourth
    waits; 3 x 4,000 + 4,000 does not (the fourth would have been admitted: something else ended the batch)."""
    findings = found(prefills([(3, 3 * prompt)] * 2))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.flag, f.current, f.severity, f.confidence) == ("--max-prefill-tokens", "16384", "info", "low")
        assert f.suggested == "32768" and "SGLang's default" in f.message


@pytest.mark.parametrize("usage,fires", [(0.89, True), (0.9, False)])
def test_a_nearly_full_pool_is_the_reason_instead(usage: float, fires: bool) -> None:
    assert bool(found(prefills([(3, 15000)] * 2, usage=usage))) is fires


@pytest.mark.parametrize("queue,fires", [(1, True), (0, False)])
def test_only_batches_with_requests_waiting_count(queue: int, fires: bool) -> None:
    assert bool(found(prefills([(3, 15000)] * 2, queue=queue))) is fires


@pytest.mark.parametrize("capped,fires", [(1, True), (2, True), (0, False)])
def test_half_of_the_waiting_batches_must_be_capped(capped: int, fires: bool) -> None:
    """Of two batches with a queue, one capped is half (fires); none capped, nothing."""
    batches = [(3, 15000)] * capped + [(2, 4000)] * (2 - capped)
    assert bool(found(prefills(batches))) is fires


@pytest.mark.parametrize("seqs,fires", [(2, True), (1, False)])
def test_one_request_alone_says_too_little_about_the_next(seqs: int, fires: bool) -> None:
    """A lone 11,000-token prompt may be a cut at a chunk of 11,000; two of 5,500 are a batch the next 5,500 would
    push past 16,384."""
    assert bool(found(prefills([(seqs, 11000)] * 2))) is fires


@pytest.mark.parametrize("tokens,fires", [(12000, True), (8192, False)])
def test_a_power_of_two_batch_without_a_printed_chunk_is_read_as_cut_at_the_chunk(tokens: int, fires: bool) -> None:
    assert bool(found(prefills([(2, tokens)] * 2))) is fires


def test_a_batch_of_several_requests_above_the_default_proves_a_larger_budget() -> None:
    assert found(prefills([(3, 15000), (3, 15000)])) and not found(prefills([(3, 15000), (2, 20000)]))


@pytest.mark.parametrize("chunk,fires,suggested", [(32768, True, "32768"), (20000, True, "20000"),
                                                   (15000, False, None)])
def test_a_printed_chunk_bounds_the_advice_and_a_batch_at_it_is_the_chunk_rule(chunk: int, fires: bool,
                                                                            suggested: str | None) -> None:
    findings = found(with_startup([(3, 15000)] * 2, chunk=chunk))
    assert bool(findings) is fires
    if fires:
        assert findings[0].suggested == suggested and "SGLang's default" not in findings[0].message


@pytest.mark.parametrize("max_prefill,fires,suggested", [(8192, True, "16384"), (16384, True, "32768"),
                                                         (32768, False, None)])
def test_the_printed_budget_is_the_one_judged(max_prefill: int, fires: bool, suggested: str | None) -> None:
    """Three prompts of 2,500 to 5,000: a budget of 8,192 ends 7,500; 16,384 ends 15,000; 32,768 ends neither."""
    prompt = 2500 if max_prefill == 8192 else 5000
    findings = found(with_startup([(3, 3 * prompt)] * 2, max_prefill=max_prefill))
    assert bool(findings) is fires
    if fires:
        assert (findings[0].current, findings[0].suggested) == (str(max_prefill), suggested)


@pytest.mark.parametrize("cap,fires", [(4096, True), (13, False)])
def test_a_running_cap_without_room_is_the_reason_instead(cap: int, fires: bool) -> None:
    """7, 10 and 13 running, 3 new each: a cap of 13 leaves room in the first batch only (one of three capped)."""
    batches = [(3, 15000)] * 3
    assert bool(found(with_startup(batches, max_running=cap))) is fires


@pytest.mark.parametrize("lines,confidence,severity", [(3, "low", "info"), (4, "medium", "warning"),
                                                       (10, "high", "warning")])
def test_confidence_grows_with_the_capped_batches(lines: int, confidence: str, severity: str) -> None:
    (f,) = found(prefills([(3, 15000)] * lines))
    assert (f.confidence, f.severity, f.evidence.count) == (confidence, severity, lines)


def test_the_earliest_era_has_no_default_budget_to_judge_by() -> None:
    """0.1.x derived the budget from the context length and the pool: not judged unless the log prints it."""
    d = analyze(lines=prefills([(3, 15000)] * 2, era="0.1.14"))
    assert not [f for f in d.findings if f.id == RULE]
    assert any("prefill token budget" in why for rule, why in d.unjudged if rule == "prefill_budget")


def test_vllm_logs_are_not_judged() -> None:
    log = lf.VllmLog().start()
    log.add(lf.vllm_stats(running=10, waiting=40, usage=0.1, gen=500.0), dt=10)
    assert not found(log.lines)


def test_the_corpus_prefill_capped_at_15000_gets_a_budget_of_32768() -> None:
    """sglang#6901: three 5,000-token prompts per prefill with 40-56 queued at 6-9% usage (chunk 32,768 set but not
    printed): the default budget of 16,384 ends each batch."""
    (f,) = [f for f in analyze([CORPUS / "sglang" / "sglang-6901-prefill-capped-15000.log"]).findings if f.id == RULE]
    assert (f.flag, f.current, f.suggested, f.confidence) == ("--max-prefill-tokens", "16384", "32768", "low")
    assert f.evidence.facts["median_prompt_tokens"] == 5000


def test_the_corpus_long_prompt_cut_at_its_chunk_is_not_read_as_capped() -> None:
    """sglang#36081: one long prompt prefilled 8,192 tokens a step (a chunk cut, the chunk not printed)."""
    d = analyze([CORPUS / "sglang" / "sglang-36081-long-prompt-chunks.log"])
    assert not [f for f in d.findings if f.id == RULE]


def test_a_line_without_a_running_count_is_judged_under_a_printed_cap() -> None:
    """A PD prefill server prints no `#running-req`: the printed cap cannot rule it out (sglang#25960's form)."""
    lines = with_startup([(3, 15000)] * 2, max_running=13)
    lines = [line.replace("#running-req: 7, ", "").replace("#running-req: 10, ", "") for line in lines]
    (f,) = found(lines)
    assert f.evidence.count == 2


@pytest.mark.parametrize("prompt,fires", [(2048, True), (1500, False)])
def test_whole_prompts_that_fill_the_budget_exactly_are_capped_by_it(prompt: int, fires: bool) -> None:
    """Eight prompts of 2,048 fill SGLang's default 16,384 exactly (a power of two, yet no chunk cut: sglang#7133's
    benchmark); eight of 1,500 leave room for a ninth below it, so something else ended the batch."""
    findings = found(prefills([(8, 8 * prompt)], queue=646, usage=0.19, running=370))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.current, f.suggested, f.confidence) == ("16384", "32768", "low")
        assert "chunked prefill of that size" in f.message


@pytest.mark.parametrize("chunk,fires", [(32768, True), (16384, False)])
def test_a_full_budget_at_a_printed_chunk_of_its_size_is_the_chunk_rule(chunk: int, fires: bool) -> None:
    findings = found(with_startup([(8, 16384)] * 2, chunk=chunk))
    assert bool(findings) is fires
    if fires:
        assert "chunked prefill of that size" not in findings[0].message
