"""`retraction.frequent`: decode ran out of KV slots and requests were retracted (re-queued, re-prefilled).

Trigger: more than 1 retraction per busy minute on some rank (at least 2 retractions); critical above 10/min.
Without timestamps (0.1-0.2.5): more than 1 retraction per 25 decode lines (1000 decode steps).
Below that, retractions are occasional and fine: a note, no finding.
"""
from __future__ import annotations

from toolkit.diagnose.fields import Value, parse_fields
from toolkit.diagnose.findings import Finding, evidence_rows
from toolkit.diagnose.rules.context import Context

FREQUENT_PER_MIN = 1.0
CRITICAL_PER_MIN = 10.0
MIN_COUNT = 2
PER_DECODE_LINES = 25


def check(ctx: Context) -> list[Finding]:
    rows = ctx.timeline.kind("retract")
    if not rows:
        return []
    count, rate, rank = ctx.retraction_rate()
    if rate is None:
        decode_lines = len(ctx.timeline.kind("decode"))
        frequent = decode_lines > 0 and count / decode_lines > 1 / PER_DECODE_LINES
        how = f"{count} retractions in {decode_lines} decode lines"
    else:
        frequent = rate > FREQUENT_PER_MIN
        how = f"{count} retractions, up to {rate:.1f} per busy minute{f' on {rank}' if rank else ''}"
    if not frequent or count < MIN_COUNT:
        ctx.notes.append(f"{how}: occasional retractions are fine.")
        return []
    current = ctx.config.schedule_conservativeness
    suggested = round(max(1.3, current * 1.3), 1)
    severity = "critical" if rate is not None and rate > CRITICAL_PER_MIN else "warning"
    retracted = sum(_int(parse_fields("retract", r[4]).get("retracted_reqs")) for r in rows)
    return [Finding(
        "retraction.frequent", severity, "Frequent retractions",
        f"{how} ({retracted} requests retracted). Each retraction throws away decoded KV and re-prefills the "
        "request later; admission was too optimistic about how much the running requests would still decode.",
        evidence_rows(rows, per_minute=round(rate, 2) if rate is not None else None, retracted_requests=retracted),
        flag="--schedule-conservativeness", suggested=f"{suggested:g}", current=f"{current:g}",
        tradeoff="A higher value admits fewer requests at once: lower peak batch and throughput, fewer retractions.",
        ranks=tuple(sorted({r[3] for r in rows})),
    )]


def _int(v: Value) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
