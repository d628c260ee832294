"""PD disaggregation's KV transfer, read on either server.

`pd_transfer.failed`: KV transfers between a PD-disaggregated prefill server and its decode server failed
(SGLang's `Prefill transfer failed for request ...` / `Decode transfer failed for request ...`, one line per TP
rank, docs/log-formats.md §6.3; vLLM V0's KV connectors on the decode side: `[rankN]: Failed to receive all KVs and
hidden states, redo model forwarding.`, no request named, the batch recomputed). Each failed transfer fails its request; nothing on this server's flags fixes it,
so the finding says where the cause is, read from the reason the transfer backend gave:

- the other side is gone (`could be dead`, `is not alive`, `might be dead`): critical; that server's own log
  holds its crash, else the transfer network between the two is down;
- `Aborted by AbortReq`: the request was aborted (its client or the router gave up) while its KV was in flight:
  a warning when it is the only reason (the client's time-out, or a slow prefill, made it give up);
- any other reason (`Failed due to an unknown reason from another rank`, a backend error): a warning that
  names it.

`pd_transfer.backlog`: a prefill server whose finished prefills wait for the decode side (`#transferring-req`)
while its KV pool is full (token usage >= FULL_USAGE) and requests queue: each of them holds its KV here until
the decode server takes it, so the decode side, not this server, paces admission. Trigger: that on at least
BACKLOG_FRACTION of the prefill lines that print `#transferring-req` (one line is a low-confidence hint); no flag
here: more decode capacity, or the decode server's own log (retractions, a full pool, a slow backend).
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from toolkit.diagnose.findings import Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.rules.context import MIN_LINES, Context

GONE = ("could be dead", "is not alive", "might be dead")
ABORTED = "Aborted by AbortReq"
OTHER_SIDE = {"prefill": "decode", "decode": "prefill"}


FULL_USAGE = 0.9
BACKLOG_FRACTION = 0.5


def check(ctx: Context) -> list[Finding]:
    return _failed(ctx) + _backlog(ctx)


def _backlog(ctx: Context) -> list[Finding]:
    prefill = ctx.timeline.series("prefill")
    if "transferring_req" not in prefill:
        return []
    prefill = prefill.where(np.isfinite(prefill["transferring_req"]))
    if not len(prefill) or "queue_req" not in prefill:
        return []
    held = prefill.where((prefill["transferring_req"] > 0) & (prefill["usage"] >= FULL_USAGE)
                         & (prefill["queue_req"] > 0))
    if len(held) < BACKLOG_FRACTION * len(prefill) or not len(held):
        return []
    confidence = confidence_of(len(prefill), MIN_LINES)
    waiting, queued = held.median("transferring_req"), held.median("queue_req")
    return [Finding(
        id="pd_transfer.backlog", severity="info" if confidence == "low" else "warning",
        title="Prefilled requests wait for the decode side",
        message=f"In {len(held)} of {len(prefill)} prefill lines the KV pool was at least {FULL_USAGE:.0%} used "
        f"(median {held.median('usage'):.2f}) while {waiting:.0f} prefilled requests (median) waited to transfer their "
        f"KV and {queued:.0f} queued: each holds its KV here until the decode server takes it, so the decode side "
        "paces this server's admission.",
        evidence=evidence(held, len(prefill), median_transferring=waiting, median_queue=queued), ranks=held.ranks,
        action="add decode capacity (more decode servers, or a larger --dp-size there), and read the decode "
               "server's log at this time: a full pool, retractions or a slow transfer backend there",
        confidence=confidence)]


def _failed(ctx: Context) -> list[Finding]:
    failed = ctx.timeline.kind("kv_transfer_failed")
    if not failed:
        return []
    reasons = Counter(str(e.fields.get("reason", "no reason given")) for e in failed)
    reason, _ = reasons.most_common(1)[0]
    sides = Counter(str(e.fields.get("side", "?")) for e in failed)
    side = sides.most_common(1)[0][0]
    other = OTHER_SIDE.get(side, "other")
    # NOTE: a line per TP rank; without a request id (vLLM's connectors) one rank's lines count the failures
    requests = (len({e.fields.get("rid") for e in failed if e.fields.get("rid")})
                or max(Counter(e.fields.get("transfer_rank", e.rank) for e in failed).values()))
    ranks = tuple(sorted({e.rank for e in failed if e.rank}))
    gone = [r for r in reasons if any(word in r for word in GONE)]
    facts = {"requests": requests, "side": side, "reason": reason, "reasons": len(reasons)}
    title = f"KV transfer failed for {requests} request{'s' if requests != 1 else ''} ({side} side)"
    if gone:
        return [Finding(
            id="pd_transfer.failed", severity="critical", title=title,
            message=f"The {side} server lost its {other} server: \"{gone[0]}\" ({len(failed)} lines over "
            f"{len(ranks) or 1} rank(s)). Those requests failed.", evidence=evidence_events(failed, **facts),
            ranks=ranks,
            action=f"Read the {other} server's log at this time first: it crashed or was restarted. If it is up, "
                   "the transfer network between the two is the suspect: the session address in the error must be "
                   "reachable from here (firewall, the RDMA device given by --disaggregation-ib-device).")]
    if all(r.startswith(ABORTED) for r in reasons):
        return [Finding(
            id="pd_transfer.failed", severity="warning", title=title,
            message=f"Requests were aborted (by their client or the router) while their KV was being transferred "
            f"({len(failed)} lines): \"{reason}\".", evidence=evidence_events(failed, **facts), ranks=ranks,
            action="If the clients did not cancel, the router's or client's time-out fired before the prefill "
                   f"finished: compare it with the prefill server's queue and TTFT in the {other} server's log.")]
    return [Finding(
        id="pd_transfer.failed", severity="warning", title=title,
        message=f"The transfer backend reported: \"{reason}\" ({len(failed)} lines, {len(reasons)} distinct reasons).",
        evidence=evidence_events(failed, **facts), ranks=ranks,
        action=f"The error is raised where the transfer broke: read the {other} server's log (and the other ranks') "
               "at this time for the first error.")]
