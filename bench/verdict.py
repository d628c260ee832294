"""The client verdict: did the load generator send on schedule, or was it the bottleneck?"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from toolkit.bench.outcome import RequestOutcome

KEPT_UP_RATIO = 0.99
LAG_TOLERANCE_MS = 10.0
LAG_GAP_FRACTION = 0.1  # lateness under a tenth of the mean gap between sends leaves the arrival process intact


@dataclass(frozen=True, slots=True)
class ClientVerdict:
    """Rates in req/s; lags in ms. `send_lag` is dispatch time minus scheduled time; `concurrency_wait` is the time
    a dispatched request then waited for a `--max-concurrency` slot."""

    scheduled_rate: float | None
    achieved_rate: float | None
    dispatch_ratio: float | None
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    concurrency_wait_p99_ms: float | None
    send_lag_limit_ms: float
    client_bottleneck: bool
    client_verdict: str

    def as_record(self) -> dict:
        return asdict(self)


def _rate(times: np.ndarray) -> float | None:
    span = float(times.max() - times.min()) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else None


def _ms(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q) * 1000.0) if len(values) else None


def _sentence(v: dict, n: int, max_concurrency: int | None, burst: bool) -> str:
    lag = f"send lag p50 {v['send_lag_p50_ms']:.2f} ms, p99 {v['send_lag_p99_ms']:.2f} ms"
    achieved, scheduled = v["achieved_rate"] or 0.0, v["scheduled_rate"] or 0.0
    if burst:
        noun = "request was" if n == 1 else f"{n} requests were"
        return f"The {noun} released at once; the last went out {v['send_lag_max_ms']:.1f} ms after its time."
    if v["client_bottleneck"]:
        return (f"The client could not keep up: it sent {achieved:.1f} req/s of the {scheduled:.1f} req/s scheduled "
                f"({lag}), so the server saw less load than asked. Lower --rate or split the load over more clients.")
    wait = v["concurrency_wait_p99_ms"]
    if max_concurrency and wait is not None and wait > LAG_TOLERANCE_MS:
        return (f"The --max-concurrency {max_concurrency} cap held requests back (wait p99 {wait:.0f} ms), so the "
                f"server saw {achieved:.1f} req/s of the {scheduled:.1f} req/s scheduled; the client kept up ({lag}).")
    return f"The client kept up: {achieved:.1f} req/s sent of {scheduled:.1f} req/s scheduled ({lag})."


def shed_verdict(shed: int, sent: int) -> str | None:
    """The sentence for a run in which the server shed load (answered 503), or None when it shed nothing."""
    if not shed:
        return None
    share = f"{shed} of {sent} requests" if shed < sent else f"all {sent} requests"
    return (f"The server shed load: it refused {share} with 503 (overloaded, retry later), so the latencies and "
            f"throughput cover only the {sent - shed} it admitted; lower --rate or add capacity.")


def send_lag_limit_ms(scheduled_rate: float | None) -> float:
    """The send lag past which the client, not the server, shaped the load: a fixed tolerance for scheduler
    jitter, or a tenth of the mean gap between scheduled sends when that is longer."""
    gap_ms = 1000.0 / scheduled_rate if scheduled_rate else 0.0
    return max(LAG_TOLERANCE_MS, LAG_GAP_FRACTION * gap_ms)


def judge(outcomes: list[RequestOutcome], start: float, max_concurrency: int | None = None) -> ClientVerdict:
    sent = [o for o in outcomes if o.dispatched > 0]
    scheduled = np.array([o.scheduled for o in sent])
    dispatched = np.array([o.dispatched - start for o in sent])
    posted = np.array([o.sent - start for o in sent if o.sent > 0])
    lag = dispatched - scheduled
    wait = np.array([o.sent - o.dispatched for o in sent if o.sent > 0])
    scheduled_rate, dispatch_rate = _rate(scheduled), _rate(dispatched)
    burst = scheduled_rate is None
    ratio = dispatch_rate / scheduled_rate if scheduled_rate and dispatch_rate else None
    v = {
        "scheduled_rate": scheduled_rate,
        "achieved_rate": _rate(posted),
        "dispatch_ratio": ratio,
        "send_lag_p50_ms": _ms(lag, 50),
        "send_lag_p99_ms": _ms(lag, 99),
        "send_lag_max_ms": _ms(lag, 100),
        "concurrency_wait_p99_ms": _ms(wait, 99),
    }
    v["send_lag_limit_ms"] = lag_limit = send_lag_limit_ms(scheduled_rate)
    # NOTE: a rate shortfall counts only once it amounts to real lateness; over a short span a millisecond of
    # jitter on the last send would otherwise read as a slow client.
    fell_behind = ratio is not None and ratio < KEPT_UP_RATIO and v["send_lag_max_ms"] > lag_limit
    v["client_bottleneck"] = bool(not burst and sent and (fell_behind or v["send_lag_p99_ms"] > lag_limit))
    v["client_verdict"] = _sentence(v, len(sent), max_concurrency, burst) if sent else "No request was sent."
    return ClientVerdict(**v)
