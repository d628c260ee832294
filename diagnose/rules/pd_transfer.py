"""`pd_transfer.failed`: KV transfers between a PD-disaggregated prefill server and its decode server failed
(SGLang's `Prefill transfer failed for request ...` / `Decode transfer failed for request ...`, one line per TP
rank, docs/log-formats.md §6.3). Each failed transfer fails its request; nothing on this server's flags fixes it,
so the finding says where the cause is, read from the reason the transfer backend gave:

- the other side is gone (`could be dead`, `is not alive`, `might be dead`): critical; that server's own log
  holds its crash, else the transfer network between the two is down;
- `Aborted by AbortReq`: the request was aborted (its client or the router gave up) while its KV was in flight:
  a warning when it is the only reason (the client's time-out, or a slow prefill, made it give up);
- any other reason (`Failed due to an unknown reason from another rank`, a backend error): a warning that
  names it.
"""
from __future__ import annotations

from collections import Counter

from toolkit.diagnose.findings import Finding, evidence_events
from toolkit.diagnose.rules.context import Context

GONE = ("could be dead", "is not alive", "might be dead")
ABORTED = "Aborted by AbortReq"
OTHER_SIDE = {"prefill": "decode", "decode": "prefill"}


def check(ctx: Context) -> list[Finding]:
    failed = ctx.timeline.kind("kv_transfer_failed")
    if not failed:
        return []
    reasons = Counter(str(e.fields.get("reason", "no reason given")) for e in failed)
    reason, _ = reasons.most_common(1)[0]
    sides = Counter(str(e.fields.get("side", "?")) for e in failed)
    side = sides.most_common(1)[0][0]
    other = OTHER_SIDE.get(side, "other")
    requests = len({e.fields.get("rid") for e in failed if e.fields.get("rid")}) or len(failed)
    ranks = tuple(sorted({e.rank for e in failed if e.rank}))
    gone = [r for r in reasons if any(word in r for word in GONE)]
    facts = {"requests": requests, "side": side, "reason": reason, "reasons": len(reasons)}
    title = f"KV transfer failed for {requests} request{'s' if requests != 1 else ''} ({side} side)"
    if gone:
        return [Finding(
            "pd_transfer.failed", "critical", title,
            f"The {side} server lost its {other} server: \"{gone[0]}\" ({len(failed)} lines over {len(ranks) or 1} "
            f"rank(s)). Those requests failed.", evidence_events(failed, **facts), ranks=ranks,
            action=f"Read the {other} server's log at this time first: it crashed or was restarted. If it is up, "
                   "the transfer network between the two is the suspect: the session address in the error must be "
                   "reachable from here (firewall, the RDMA device given by --disaggregation-ib-device).")]
    if all(r.startswith(ABORTED) for r in reasons):
        return [Finding(
            "pd_transfer.failed", "warning", title,
            f"Requests were aborted (by their client or the router) while their KV was being transferred "
            f"({len(failed)} lines): \"{reason}\".", evidence_events(failed, **facts), ranks=ranks,
            action="If the clients did not cancel, the router's or client's time-out fired before the prefill "
                   f"finished: compare it with the prefill server's queue and TTFT in the {other} server's log.")]
    return [Finding(
        "pd_transfer.failed", "warning", title,
        f"The transfer backend reported: \"{reason}\" ({len(failed)} lines, {len(reasons)} distinct reasons).",
        evidence_events(failed, **facts), ranks=ranks,
        action=f"The error is raised where the transfer broke: read the {other} server's log (and the other ranks') "
               "at this time for the first error.")]
