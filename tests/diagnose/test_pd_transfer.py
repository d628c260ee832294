"""`pd_transfer.failed` on synthetic lines across its three reasons (and none without the lines), and on the two
real excerpts of the corpus."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.diagnose import analyze

REAL = Path(__file__).parent / "real_logs"
DECODE_HEALTHY = [f"[2026-02-26 16:00:{s:02d} TP0] Decode batch. #running-req: 4, #token: 900, token usage: 0.10, "
                  f"gen throughput (token/s): 120.00, #queue-req: 0" for s in range(12)]


def failed(side: str, rank: int, rid: str, reason: str) -> str:
    room = "887504041590801090"
    owner = "req" if side == "Prefill" else "decode_req.req"
    return (f"[2026-02-26 16:00:13 TP{rank}] {side} transfer failed for request rank={rank} {owner}.rid='{rid}' "
            f"{owner}.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {reason}")


def finding(lines: list[str]):
    found = [f for f in analyze(lines=lines).findings if f.id == "pd_transfer.failed"]
    return found[0] if found else None


@pytest.mark.parametrize(("reason", "severity", "words"), [
    ("Decode instance could be dead, remote mooncake session 10.99.91.35:16581 is not alive", "critical",
     "Read the decode server's log"),
    ("Aborted by AbortReq.", "warning", "time-out"),
    ("Failed due to an unknown reason from another rank", "warning", "first error"),
])
def test_the_reason_decides_severity_and_where_to_look(reason, severity, words) -> None:
    lines = DECODE_HEALTHY + [failed("Prefill", rank, "05d7", reason) for rank in (8, 9, 10)]
    f = finding(lines)
    assert f is not None and f.severity == severity and words in (f.action or "")
    assert f.title == "KV transfer failed for 1 request (prefill side)"  # three ranks, one request
    assert f.evidence.count == 3 and f.ranks == ("TP10", "TP8", "TP9") and f.change is None
    assert f.evidence.facts["reason"] == reason


def test_no_failed_transfer_no_finding_and_two_requests_are_counted() -> None:
    assert finding(DECODE_HEALTHY) is None
    two = finding([failed("Decode", 0, "a1", "Aborted by AbortReq."), failed("Decode", 0, "b2", "Aborted by AbortReq.")])
    assert two is not None and two.title == "KV transfer failed for 2 requests (decode side)"
    assert "prefill server" in (two.action or "")


@pytest.mark.parametrize(("path", "severity"), [
    ("sglang/sglang-12688-pd-decode-transfer-aborted.log", "warning"),
    ("downstream/mooncake-851-pd-decode-transfer-other-rank.log", "warning"),
])
def test_the_real_excerpts_get_the_finding(path, severity) -> None:
    found = [f for f in analyze([REAL / path]).findings if f.id == "pd_transfer.failed"]
    assert [f.severity for f in found] == [severity]
    assert found[0].title.endswith("(decode side)")
