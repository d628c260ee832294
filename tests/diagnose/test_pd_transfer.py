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


def not_received(rank: int, worker_pid: int | None) -> str:
    """vLLM V0's KV connectors on the decode side (simple, Mooncake store): per rank, no request named."""
    prefix = f"(VllmWorkerProcess pid={worker_pid}) " if worker_pid else ""
    return (f"{prefix}WARNING 04-18 04:13:04 [simple_connector.py:196] [rank{rank}]: Failed to receive all KVs and "
            "hidden states, redo model forwarding.")


def test_vllms_connector_recomputing_what_it_did_not_receive_is_one_failure_seen_by_every_rank() -> None:
    lines = [not_received(0, None)] + [not_received(rank, 22920 + rank) for rank in (1, 2, 3)]
    f = finding(lines)
    assert f is not None and f.severity == "warning" and f.change is None
    assert f.title == "KV transfer failed for 1 request (decode side)" and f.evidence.count == 4
    assert "redo model forwarding" in f.evidence.facts["reason"] and "prefill server" in (f.action or "")
    assert finding([not_received(0, None), not_received(0, None)]).title.startswith("KV transfer failed for 2 ")


@pytest.mark.parametrize(("path", "severity"), [
    ("sglang/sglang-12688-pd-decode-transfer-aborted.log", "warning"),
    ("downstream/mooncake-851-pd-decode-transfer-other-rank.log", "warning"),
    ("downstream/mooncake-269-v0-store-kv-receive-redo-forwarding.log", "warning"),
])
def test_the_real_excerpts_get_the_finding(path, severity) -> None:
    found = [f for f in analyze([REAL / path]).findings if f.id == "pd_transfer.failed"]
    assert [f.severity for f in found] == [severity]
    assert found[0].title.endswith("(decode side)")


# -- pd_transfer.backlog: a prefill server's pool held by requests waiting for the decode side ------------------

def pd_prefill(n: int, usage: float, transferring: int, queue: int) -> list[str]:
    """A PD prefill server's lines (sglang#7353's form: no #running-req, #transferring-req instead)."""
    return [f"[2025-06-18 18:11:{s:02d}] Prefill batch. #new-seq: 14, #new-token: 8192, #cached-token: 0, token usage: "
            f"{usage:.2f}, #unbootstrapped-req: 0, #queue-req: {queue}, #transferring-req: {transferring}, input "
            "throughput (token/s): 96875.08 " for s in range(n)]


def backlog(lines: list[str]):
    found = [f for f in analyze(lines=lines).findings if f.id == "pd_transfer.backlog"]
    return found[0] if found else None


@pytest.mark.parametrize(("usage", "transferring", "queue", "fires"), [
    (0.90, 990, 105, True), (0.89, 990, 105, False), (0.95, 0, 105, False), (0.95, 990, 0, False)])
def test_a_full_prefill_pool_held_by_transfers_with_a_queue_is_the_decode_side(usage, transferring, queue,
                                                                             fires) -> None:
    f = backlog(pd_prefill(12, usage, transferring, queue))
    assert (f is not None) is fires
    if fires:
        assert f.severity == "warning" and f.confidence == "high" and f.change is None
        assert "decode capacity" in (f.action or "") and f.evidence.facts["median_transferring"] == transferring


@pytest.mark.parametrize(("held", "fires"), [(6, True), (5, False)])
def test_the_backlog_is_judged_on_half_the_prefill_lines(held: int, fires: bool) -> None:
    lines = pd_prefill(held, 0.95, 990, 105) + pd_prefill(11 - held, 0.5, 10, 0)
    assert (backlog(lines) is not None) is fires


def test_the_real_excerpt_with_a_thousand_transferring_requests_is_a_low_confidence_hint() -> None:
    """sgl-project/sglang#7353: three lines at 0.92-0.95 usage, ~1,000 transferring, 76-105 queued."""
    (f,) = [f for f in analyze([REAL / "sglang" / "sglang-7353-pd-prefill-transfer-backlog.log"]).findings]
    assert (f.id, f.severity, f.confidence, f.evidence.count) == ("pd_transfer.backlog", "info", "low", 3)


def test_a_prefill_server_without_transfer_counts_has_no_backlog() -> None:
    assert backlog([line.replace(", #transferring-req: 990", "") for line in pd_prefill(12, 0.95, 990, 105)]) is None
