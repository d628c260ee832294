"""`speculative.low_acceptance`: speculative decoding whose drafts are mostly rejected, across its threshold on
SGLang decode lines and vLLM SpecDecoding records, and on the corpus excerpts that print acceptance."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnose.logfactory import VllmLog
from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Finding

CORPUS = Path(__file__).parent / "real_logs"
RULE = "speculative.low_acceptance"


def _sglang(n: int, length: float, rate: float) -> list[str]:
    return [f"[2026-08-14 14:02:{i:02d} TP0] Decode batch, #running-req: 3, #token: 266624, token usage: 0.43, "
            f"accept len: {length:.2f}, accept rate: {rate:.2f}, cuda graph: True, gen throughput (token/s): 183.10, "
            "#queue-req: 0" for i in range(n)]


def _vllm(n: int, length: float, rate: float, drafted: int = 200) -> list[str]:
    log = VllmLog().start()
    for _ in range(n):
        log.add(_v1_record(length, rate, drafted), dt=10, file="metrics.py:120")
    return log.lines


def _v1_record(length: float, rate: float, drafted: int) -> str:
    return (f"SpecDecoding metrics: Mean acceptance length: {length:.2f}, Accepted throughput: 10.00 tokens/s, "
            f"Drafted throughput: 20.00 tokens/s, Accepted: {round(rate * drafted)} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: 0.500, Avg Draft acceptance rate: {100 * rate:.1f}%")


def _v0(records: list[tuple[int, int, int]], k: int = 5) -> list[str]:
    """V0's cumulative `Speculative metrics` (accepted, drafted, emitted tokens since start-up)."""
    return [f"INFO 02-06 03:{i:02d}:53 metrics.py:475] Speculative metrics: Draft acceptance rate: "
            f"{accepted / drafted:.3f}, System efficiency: 0.167, Number of speculative tokens: {k}, Number of "
            f"accepted tokens: {accepted}, Number of draft tokens: {drafted}, Number of emitted tokens: {emitted}."
            for i, (accepted, drafted, emitted) in enumerate(records)]


def found(lines: list[str]) -> list[Finding]:
    return [f for f in analyze(lines=lines).findings if f.id == RULE]


@pytest.mark.parametrize("n,rate,fires,confidence", [(3, 0.29, True, "low"), (3, 0.31, False, None),
                                                    (1, 0.1, True, "low"), (12, 0.29, True, "high")])
def test_sglang_low_acceptance_is_a_median_rate_below_0_3(n: int, rate: float, fires: bool, confidence) -> None:
    """One line already says it (at low confidence: a short excerpt is judged, not dismissed)."""
    findings = found(_sglang(n, 1.7, rate))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert f.severity == "info" and f.flag == "--speculative-num-draft-tokens"
        assert f.suggested == "3 (or --speculative-num-steps lower; or --speculative-eagle-topk 1)"
        assert f.confidence == confidence and f.evidence.facts["accept_rate"] == rate


@pytest.mark.parametrize("rate,fires", [(0.25, True), (0.35, False)])
def test_vllm_low_acceptance_advises_fewer_speculative_tokens(rate: float, fires: bool) -> None:
    findings = found(_vllm(4, 2.4, rate))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.engine, f.flag, f.suggested, f.confidence) == ("vllm", "--speculative-config.num_speculative_tokens", "2",
                                                                    "medium")
        assert "--num-speculative-tokens" not in f.message + f.suggested


@pytest.mark.parametrize("drafted,confidence", [(40, "low"), (100, "medium"), (999, "medium"), (1000, "high")])
def test_vllm_confidence_grows_with_the_drafted_tokens(drafted: int, confidence: str) -> None:
    """Two records over thousands of drafted tokens are sure; two over a few dozen are a hint."""
    (f,) = found(_vllm(2, 1.1, 0.05, drafted=drafted // 2))
    assert f.confidence == confidence and f.evidence.facts["drafted_tokens"] == drafted // 2 * 2


@pytest.mark.parametrize("second,fires", [(100, True), (1000, False)])
def test_vllm_v1_rate_is_over_all_drafted_tokens_not_the_median_record(second: int, fires: bool) -> None:
    """10 of 1,000 drafts accepted, then 90 of 100: 9% of all drafts (the median record says 45%); with 900 of
    1,000 in the second it is 45.5%."""
    log = VllmLog().start()
    log.add(_v1_record(1.1, 0.01, 1000), dt=10, file="metrics.py:120")
    log.add(_v1_record(3.5, 0.9, second), dt=10, file="metrics.py:120")
    findings = found(log.lines)
    assert bool(findings) is fires
    if fires:
        assert findings[0].evidence.facts["accept_rate"] == round(100 / 1100, 3)


@pytest.mark.parametrize("accepted,fires", [(43, True), (47, False)])
def test_vllm_v0_cumulative_metrics_are_read_from_the_latest_record(accepted: int, fires: bool) -> None:
    """V0 counts since start-up: the latest record (150 drafts) decides, whatever the first said (1 of 5 then
    0.2, always under the threshold); its tokens per step are the emitted tokens per 5-draft step."""
    findings = found(_v0([(1, 5, 1), (accepted, 150, 2 * 30)]))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.flag, f.suggested, f.confidence) == ("--num-speculative-tokens", "1", "medium")
        assert f.evidence.facts["accept_len"] == 2.0 and f.evidence.facts["drafted_tokens"] == 150


@pytest.mark.parametrize("name,rate,confidence", [("vllm/vllm-41789-v1-mtp-low-acceptance", 0.007, "high"),
                                                  ("vllm/vllm-7301-v0-spec-low-acceptance", 0.067, "low")])
def test_held_out_excerpts_with_few_records_are_judged(name: str, rate: float, confidence: str) -> None:
    """Two records each: V1's over 5,376 drafted tokens (Gemma-4 MTP, 40 accepted), V0's over 15 (cumulative)."""
    (f,) = [f for f in analyze([CORPUS / f"{name}.log"]).findings if f.id == RULE]
    assert (f.suggested, f.confidence, f.evidence.facts["accept_rate"]) == ("1", confidence, rate)


def test_the_corpus_pd_decode_with_mtp_accepting_14_percent_is_found() -> None:
    (f,) = [f for f in analyze([CORPUS / "sglang/sglang-30393-hicache-pd-decode-mtp.log"]).findings if f.id == RULE]
    assert f.suggested == "3 (or --speculative-num-steps lower; or --speculative-eagle-topk 1)"


@pytest.mark.parametrize("name", ["sglang/sglang-11948-eagle3-low-accept", "sglang/sglang-npu-608-spec-ep-decode",
                                  "vllm/vllm-42363-v1-kimi-spec-metrics", "vllm/vllm-24127-v1-specdecoding-metrics",
                                  "downstream/vllm-ascend-11876-engine-001-deferred",
                                  "vllm/vllm-15902-spec-metrics-before-after"])
def test_corpus_speculation_accepting_most_drafts_is_not_found(name: str) -> None:
    assert not [f for f in analyze([CORPUS / f"{name}.log"]).findings if f.id == RULE]


def test_vllm_v0_cumulative_metrics_of_two_engines_are_summed(tmp_path) -> None:
    """Each engine (here: each log) counts since its own start: the latest record of each, summed."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join(_v0([(1, 5, 1), (5, 100, 30)])) + "\n")
    b.write_text("\n".join(_v0([(20, 100, 40)])) + "\n")
    (f,) = [f for f in analyze([a, b]).findings if f.id == RULE]
    assert f.evidence.facts["drafted_tokens"] == 200 and f.evidence.facts["accept_rate"] == 0.125
    assert f.evidence.count == 2 and "over 2 speculative-decoding metrics lines" in f.message
