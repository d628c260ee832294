"""`client.bottleneck`: from a `toolkit bench` run (`--bench`): the client could not send at the asked rate.

Trigger: the record says `client_bottleneck`, or achieved rate < 90% of the requested rate, or send lag
p99 > 50 ms.
"""
from __future__ import annotations

from diagnose.findings import Evidence, Finding
from diagnose.rules.context import Context

ACHIEVED_FRACTION = 0.9
SEND_LAG_MS = 50.0


def check(ctx: Context) -> list[Finding]:
    out = []
    for run in ctx.bench.runs if ctx.bench else []:
        reasons = []
        if run.client_bottleneck:
            reasons.append("the bench run flagged the client as the bottleneck")
        if run.request_rate and run.achieved_rate is not None and run.achieved_rate < ACHIEVED_FRACTION * run.request_rate:
            reasons.append(f"it achieved {run.achieved_rate:.2f} of {run.request_rate:.2f} req/s")
        if run.send_lag_p99_ms is not None and run.send_lag_p99_ms > SEND_LAG_MS:
            reasons.append(f"send lag p99 was {run.send_lag_p99_ms:.0f} ms")
        if reasons:
            span = (run.started_at, run.ended_at) if run.started_at and run.ended_at else None
            out.append(Finding(
                "client.bottleneck", "warning", "The client, not the server, was the bottleneck",
                "In the bench run " + "; ".join(reasons) + ": the server's numbers understate what it can do.",
                Evidence(1, None, span, (), run.facts()), None,
                "client: more concurrency / a faster client machine", None,
                "None on the server; rerun the benchmark before tuning from it."))
    return out
