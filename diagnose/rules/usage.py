"""`usage.low_while_queued`: requests wait although the KV pool has room.

Trigger: among steady decode lines with `#queue-req` > 0 (and the running batch below 95% of its cap, so the
cap is not the reason), >= 50% show token usage < 0.9, and retractions are not frequent. `token usage`
excludes the evictable radix cache, which admission counts as free, so low usage with a queue means the
admission estimate (`new_token_ratio`, scaled by `--schedule-conservativeness`) held requests back.
Suggest 0.3 (half the current value when it is <= 0.5, at least 0.1); at 0.1 or below there is nothing lower
to suggest, so no finding.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, ranks_of
from toolkit.diagnose.rules.retraction import FREQUENT_PER_MIN

LOW_USAGE = 0.9
LOW_FRACTION = 0.5
SUGGESTED = 0.3
MIN_SUGGESTED = 0.1


def check(ctx: Context) -> list[Finding]:
    steady = ctx.steady()
    queued = steady[steady["queue_req"] > 0]
    cap = ctx.config.max_running_requests
    if cap:
        queued = queued[queued["running_req"] < 0.95 * cap]
    if len(queued) < MIN_LINES:
        return []
    low = queued[queued["usage"] < LOW_USAGE]
    fraction = len(low) / len(queued)
    _, rate, _ = ctx.retraction_rate()
    current = ctx.config.schedule_conservativeness
    if fraction < LOW_FRACTION or (rate is not None and rate > FREQUENT_PER_MIN) or current <= MIN_SUGGESTED:
        return []
    suggested = SUGGESTED if current > 0.5 else round(max(MIN_SUGGESTED, current / 2), 2)
    usage = float(low["usage"].median())
    return [Finding(
        "usage.low_while_queued", "warning", "Requests queued while the KV pool had room",
        f"In {fraction:.0%} of {len(queued)} steady decode lines with a queue, token usage was below "
        f"{LOW_USAGE} (median {usage:.2f}, queue median {int(low['queue_req'].median())}). Admission "
        "reserves room for every running request's remaining output; a lower conservativeness admits more.",
        evidence(low, len(queued), median_usage=round(usage, 3)),
        flag="--schedule-conservativeness", suggested=f"{suggested:g}", current=f"{current:g}",
        tradeoff="Admitting more can run the pool out during decode: watch for retractions.",
        ranks=ranks_of(low),
    )]
