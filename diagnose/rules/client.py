"""`client.bottleneck`: from a bench run (`--bench`): the client could not send at the asked rate.

A `toolkit bench` record carries the client's own verdict (`client_bottleneck`, judged against the run's own
send schedule: dispatch ratio and send lag, see `bench/verdict.py`), so a short Poisson run whose drawn
schedule was slower than the nominal rate, or a `--max-concurrency` cap holding requests back, is not blamed
on the client. Records of other tools, without the verdict: send lag p99 > 50 ms, or an achieved rate below
the scheduled rate by 10%, or below the nominal rate by more than sampling noise allows: 10%, or 3/sqrt(n)
when the record says how many requests n it sent (3x the relative spread of a Poisson count), so a short run
is not judged by its luck of the draw.
"""
from __future__ import annotations

import math

from toolkit.bench.record import BenchRecord
from toolkit.diagnose.bench_input import run_facts
from toolkit.diagnose.findings import Evidence, Finding
from toolkit.diagnose.rules.context import Context

ACHIEVED_FRACTION = 0.9
NOISE_SIGMAS = 3.0
SEND_LAG_MS = 50.0


def check(ctx: Context) -> list[Finding]:
    runs = ctx.bench.runs if ctx.bench else ()
    return [_finding(run, why) for run in runs if (why := _why(run)) is not None]


def _why(run: BenchRecord) -> str | None:
    """The sentence blaming the client, or None when the client kept up."""
    if run.client_bottleneck is not None:  # NOTE: `toolkit bench`'s own verdict
        if not run.client_bottleneck:
            return None
        return run.client_verdict or "The bench run flagged the client as the bottleneck."
    found = [r for r in (_rate_reason(run), _lag_reason(run)) if r]
    return f"In the bench run {'; '.join(found)}." if found else None


def _rate_reason(run: BenchRecord) -> str | None:
    target = run.scheduled_rate or run.request_rate_number
    if run.achieved_rate is None or not target:
        return None
    n = run.num_requests or run.completed
    tolerance = 1.0 - ACHIEVED_FRACTION
    if not run.scheduled_rate and n:
        tolerance = max(tolerance, NOISE_SIGMAS / math.sqrt(n))
    if run.achieved_rate >= (1.0 - tolerance) * target:
        return None
    return f"it achieved {run.achieved_rate:.2f} of {target:.2f} req/s"


def _lag_reason(run: BenchRecord) -> str | None:
    if run.send_lag_p99_ms is None or run.send_lag_p99_ms <= SEND_LAG_MS:
        return None
    return f"send lag p99 was {run.send_lag_p99_ms:.0f} ms"


def _finding(run: BenchRecord, why: str) -> Finding:
    span = (float(run.started_at), float(run.ended_at)) if run.started_at and run.ended_at else None
    return Finding(
        id="client.bottleneck", severity="warning", title="The client, not the server, was the bottleneck",
        message=f"{why} The server's numbers understate what it can do.",
        evidence=Evidence(count=1, span=span, facts=run_facts(run)),
        tradeoff="None on the server; rerun the benchmark before tuning from it.",
        action="client: more concurrency / a faster client machine")
