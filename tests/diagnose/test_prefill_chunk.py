"""`prefill_chunk.too_small`: prefill steps cut at a small `--chunked-prefill-size` while the pool has room, with
the chunk sized from the log (mean prompt length x the prompts waiting), across each threshold."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup
from tests.diagnose.test_rules import ARGS
from toolkit.diagnose import analyze
from toolkit.diagnose.rules.prefill_chunk import MAX_CHUNK, suggested_chunk

ERA = "0.4.9"


def chunked_steps(prompts: list[int], chunk: int) -> list[tuple[int, int]]:
    """(#new-seq, #new-token) of the prefill steps SGLang runs for `prompts` queued at once with a `chunk`-token
    budget per step: a step takes whole prompts while they fit and cuts the next one at the budget; the cut prompt
    opens the next step (and is counted there again)."""
    steps, left, i = [], list(prompts), 0
    while i < len(left):
        budget, seqs = chunk, 0
        while i < len(left) and budget > 0:
            take = min(budget, left[i])
            budget, left[i], seqs = budget - take, left[i] - take, seqs + 1
            if left[i] == 0:
                i += 1
        steps.append((seqs, chunk - budget))
    return steps


def log_of(steps: list[tuple[int, int]], *, chunk: int, queue: int, usage: float = 0.2, era: str = ERA,
           pool: int = 665690) -> Log:
    log = Log(era).start(Startup(chunk=chunk, max_total=pool), **{**ARGS, "chunked_prefill_size": chunk})
    for seqs, tokens in steps:
        log.add(lf.prefill(era, new_seq=seqs, new_token=tokens, cached=0, running=4, queue=queue, usage=usage,
                           token=int(usage * pool)), dt=0.5)
        log.add(lf.decode(era, running=4, token=int(usage * pool), usage=usage, throughput=300.0, queue=queue),
                dt=0.5)
    return log


def finding(log: Log):
    found = [f for f in analyze(lines=log.lines).findings if f.id == "prefill_chunk.too_small"]
    return found[0] if found else None


def test_the_chunk_is_sized_to_hold_the_waiting_prompts_at_their_mean_length() -> None:
    steps = chunked_steps([1200] * 12, chunk=128)
    f = finding(log_of(steps, chunk=128, queue=3))
    assert f is not None and f.flag == "--chunked-prefill-size" and f.current == "128"
    # about 1200 tokens a prompt (the cut prompts' second counting subtracted), 3 queued + the cut one
    assert f.evidence.facts["mean_prompt_tokens"] == pytest.approx(1200, rel=0.15)
    assert f.suggested == "8192"  # 4 x ~1200 = ~4800 → the next power of two
    assert f.severity == "warning" and f.confidence == "high"


def test_the_suggestion_is_at_least_double_and_never_past_the_pool() -> None:
    assert suggested_chunk(512, 300.0, None) == 1024  # the evidence asks for less: still 2x
    assert suggested_chunk(512, 50_000.0, None) == MAX_CHUNK
    assert suggested_chunk(512, 50_000.0, 3000) == 2048  # the pool's largest power of two


@pytest.mark.parametrize("cut,fires", [(8, True), (7, False)])
def test_fires_when_half_the_prefill_steps_are_cut(cut: int, fires: bool) -> None:
    long_prompts = chunked_steps([600] * 4, chunk=256)[:cut]  # every one of these is cut at 256
    assert all(tokens == 256 for _, tokens in long_prompts)
    steps = [(1, 100)] * (16 - cut)
    for k, step in enumerate(long_prompts):  # spread over the log, as in a steady stream
        steps.insert(2 * k + 1, step)
    assert (finding(log_of(steps, chunk=256, queue=2)) is not None) is fires


@pytest.mark.parametrize("usage,fires", [(0.85, True), (0.95, False)])
def test_a_full_pool_is_memory_not_the_chunk(usage: float, fires: bool) -> None:
    steps = chunked_steps([1000] * 10, chunk=256)
    assert (finding(log_of(steps, chunk=256, queue=4, usage=usage)) is not None) is fires


def test_a_chunk_at_the_maximum_or_prompts_that_fit_get_nothing() -> None:
    assert finding(log_of(chunked_steps([20_000] * 3, chunk=MAX_CHUNK), chunk=MAX_CHUNK, queue=5)) is None
    assert finding(log_of([(1, 200)] * 20, chunk=1024, queue=3)) is None  # no step reaches the chunk


def test_too_few_prefill_lines_cannot_be_judged() -> None:
    d = analyze(lines=log_of(chunked_steps([4000] * 1, chunk=1024), chunk=1024, queue=0).lines)
    assert not {"prefill_chunk.too_small", "prefill_chunk.tiny"} & {f.id for f in d.findings}
    assert ("prefill_chunk", "4 prefill lines (needs 5)") in d.unjudged


def test_a_tiny_chunk_is_advised_instead_of_saying_the_load_could_not_be_judged() -> None:
    d = analyze(lines=log_of(chunked_steps([1000] * 1, chunk=256), chunk=256, queue=0).lines)
    assert "prefill_chunk.tiny" in {f.id for f in d.findings}
    assert not [why for rule, why in d.unjudged if rule == "prefill_chunk"]


@pytest.mark.parametrize("pool,max_prefill,suggested,companion", [(665690, 16384, "2048", None),
                                                                  (1500, 16384, "1024", None),
                                                                  (600, 16384, "512", None),
                                                                  (300, 16384, None, None),
                                                                  (665690, 1024, "2048", "2048")])
def test_the_tiny_chunks_advice_fits_the_pool_and_raises_a_lower_prefill_budget(
        pool: int, max_prefill: int, suggested: str | None, companion: str | None) -> None:
    """A pool of 1,500 tokens holds no 2,048-token chunk (1,024 then), of 600 one of 512, of 300 none above the 256
    it has (no advice); a `--max-prefill-tokens` below the advice comes along with it."""
    log = Log(ERA).start(Startup(chunk=256, max_total=pool, max_prefill=max_prefill),
                         **{**ARGS, "chunked_prefill_size": 256, "max_prefill_tokens": max_prefill})
    found = [f for f in analyze(lines=log.lines).findings if f.id == "prefill_chunk.tiny"]
    assert [f.change.value for f in found] == ([suggested] if suggested else [])
    if found:
        assert [c.value for c in found[0].change.companions] == ([companion] if companion else [])


@pytest.mark.parametrize("chunk,fires", [(64, True), (511, True), (512, False)])
def test_a_chunk_below_512_tokens_is_advised_up_whatever_the_load(chunk: int, fires: bool) -> None:
    """sglang#3713 ran with `chunked_prefill_size=64`: every prompt takes a forward pass per 64 tokens; no load
    needed to say so (one prefill line here)."""
    log = Log(ERA).start(Startup(chunk=chunk), **{**ARGS, "chunked_prefill_size": chunk})
    log.add(lf.prefill(ERA, new_seq=1, new_token=chunk, cached=0, running=0, queue=1), dt=1)
    findings = [f for f in analyze(lines=log.lines).findings if f.id == "prefill_chunk.tiny"]
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.flag, f.suggested, f.current, f.severity) == ("--chunked-prefill-size", "2048", str(chunk), "info")
        assert f.evidence.facts == {"chunk": chunk, "cut_lines": 1} and f.evidence.lines


def test_the_corpus_lora_server_with_a_64_token_chunk_is_advised() -> None:
    d = analyze([Path(__file__).parent / "real_logs" / "sglang" / "sglang-3713-lora-chunked-prefill-64.log"])
    (f,) = [f for f in d.findings if f.id == "prefill_chunk.tiny"]
    assert (f.suggested, f.evidence.facts["cut_lines"]) == ("2048", 2)


def _unprinted(batches: list[tuple[int, int]], queue: int = 7) -> list[str]:
    """Prefill lines of a PD prefill server with DP ranks (no start-up, no chunk printed): (#new-seq, #new-token)."""
    return [f"[2025-10-15 14:44:3{i} DP{i} TP{i} EP{i}] Prefill batch. #new-seq: {seqs}, #new-token: {tokens}, "
            f"#cached-token: 0, token usage: 0.01, #unbootstrapped-req: 0, #queue-req: {queue}, #transferring-req: 1, "
            f"input throughput (token/s): 1367.19, " for i, (seqs, tokens) in enumerate(batches)]


@pytest.mark.parametrize("batches,fires", [
    ([(1, 512), (3, 512), (1, 512), (4, 331), (2, 512)], True),   # sglang#11648: four steps of 512, two of several
    ([(1, 512), (3, 512), (4, 331), (2, 300), (1, 200)], False),  # two steps of 512: fewer than CUTS_SEEN
    ([(1, 512), (1, 512), (1, 512), (4, 331), (1, 512)], False),  # one request a step: prompts of 512, maybe
    ([(1, 500), (3, 500), (1, 500), (4, 331), (2, 500)], False),  # no power of two: no chunk
])
def test_a_chunk_the_lines_show_where_the_log_does_not_print_it(batches: list[tuple[int, int]], fires: bool) -> None:
    from toolkit.diagnose.rules.prefill_chunk import CUTS_SEEN

    assert CUTS_SEEN == 3
    f = next((f for f in analyze(lines=_unprinted(batches)).findings if f.id == "prefill_chunk.too_small"), None)
    assert (f is not None) is fires
    if fires:
        assert (f.flag, f.suggested, f.current, f.severity, f.confidence) == (
            "--chunked-prefill-size", "4096", None, "info", "low")  # 8 waiting prompts of ~340 tokens
        assert "read from the lines" in f.message
    assert not any(f.id == "prefill_chunk.too_small" for f in analyze(lines=_unprinted(batches, queue=0)).findings)
