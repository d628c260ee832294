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


def _vllm(n: int, length: float, rate: float) -> list[str]:
    log = VllmLog().start()
    for _ in range(n):
        log.add(f"SpecDecoding metrics: Mean acceptance length: {length:.2f}, Accepted throughput: 10.00 tokens/s, "
                f"Drafted throughput: 20.00 tokens/s, Accepted: 100 tokens, Drafted: 200 tokens, Per-position "
                f"acceptance rate: 0.500, Avg Draft acceptance rate: {100 * rate:.1f}%", dt=10, file="metrics.py:120")
    return log.lines


def found(lines: list[str]) -> list[Finding]:
    return [f for f in analyze(lines=lines).findings if f.id == RULE]


@pytest.mark.parametrize("n,rate,fires", [(3, 0.29, True), (3, 0.31, False), (2, 0.1, False)])
def test_sglang_low_acceptance_is_a_median_rate_below_0_3_on_three_lines(n: int, rate: float, fires: bool) -> None:
    findings = found(_sglang(n, 1.7, rate))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert f.severity == "info" and f.flag == "--speculative-num-draft-tokens"
        assert f.suggested == "3 (or --speculative-num-steps lower; or --speculative-eagle-topk 1)"
        assert f.confidence == "low" and f.evidence.facts["median_accept_rate"] == rate


@pytest.mark.parametrize("rate,fires", [(0.25, True), (0.35, False)])
def test_vllm_low_acceptance_advises_fewer_speculative_tokens(rate: float, fires: bool) -> None:
    findings = found(_vllm(4, 2.4, rate))
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.engine, f.flag, f.suggested, f.confidence) == ("vllm", "--num-speculative-tokens", "2", "medium")


def test_the_corpus_pd_decode_with_mtp_accepting_14_percent_is_found() -> None:
    (f,) = [f for f in analyze([CORPUS / "sglang/sglang-30393-hicache-pd-decode-mtp.log"]).findings if f.id == RULE]
    assert f.suggested == "3 (or --speculative-num-steps lower; or --speculative-eagle-topk 1)"


@pytest.mark.parametrize("name", ["sglang/sglang-11948-eagle3-low-accept", "sglang/sglang-npu-608-spec-ep-decode",
                                  "vllm/vllm-42363-v1-kimi-spec-metrics", "vllm/vllm-24127-v1-specdecoding-metrics",
                                  "downstream/vllm-ascend-11876-engine-001-deferred",
                                  "vllm/vllm-15902-spec-metrics-before-after"])
def test_corpus_speculation_accepting_most_drafts_is_not_found(name: str) -> None:
    assert not [f for f in analyze([CORPUS / f"{name}.log"]).findings if f.id == RULE]
