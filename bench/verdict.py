"""The client verdict, two facts apart: did the load generator send on schedule (dispatch), and are the latencies
it measured free of its own delays (timing)? At high rates a client can send every request on time while its event
loop, busy with the streams, reads tokens late: dispatch kept up, timing did not."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from toolkit.bench.metrics import request_metrics
from toolkit.bench.outcome import RequestOutcome

KEPT_UP_RATIO = 0.99
LAG_TOLERANCE_MS = 10.0
LAG_GAP_FRACTION = 0.1  # lateness under a tenth of the mean gap between sends leaves the arrival process intact
TIMING_TOLERANCE_MS = 2.0  # the loop's timer granularity (1 ms in uvloop) and scheduler jitter
TIMING_TTFT_FRACTION = 0.1  # loop lag under a tenth of the median TTFT leaves the measured latencies within 10 %


@dataclass(frozen=True, slots=True)
class ClientVerdict:
    """Rates in req/s; lags in ms. `send_lag` is dispatch time minus scheduled time; `concurrency_wait` is the time
    a dispatched request then waited for a `--max-concurrency` slot; `loop_lag` is how late the event loop woke for
    a due timer, so how late a token arriving then was timestamped. `client_bottleneck` is the dispatch fact: the client, not the server,
    shaped the load; `timing_kept_up` is None where the loop was not sampled."""

    scheduled_rate: float | None
    achieved_rate: float | None
    dispatch_ratio: float | None
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    concurrency_wait_p99_ms: float | None
    send_lag_limit_ms: float
    loop_lag_p50_ms: float | None
    loop_lag_p99_ms: float | None
    timing_lag_limit_ms: float
    dispatch_kept_up: bool
    timing_kept_up: bool | None
    client_bottleneck: bool
    client_verdict: str

    def as_record(self) -> dict:
        return asdict(self)


def _rate(times: np.ndarray) -> float | None:
    span = float(times.max() - times.min()) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else None


def _ms(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q) * 1000.0) if len(values) else None


def _dispatch_clause(v: dict) -> str:
    achieved, scheduled = v["achieved_rate"] or 0.0, v["scheduled_rate"] or 0.0
    return (f"it sent {achieved:.1f} req/s of the {scheduled:.1f} req/s scheduled (send lag p50 "
            f"{v['send_lag_p50_ms']:.2f} ms, p99 {v['send_lag_p99_ms']:.2f} ms, limit {v['send_lag_limit_ms']:.1f} ms)")


def _timing_clause(v: dict) -> str:
    return (f"its event loop woke {v['loop_lag_p99_ms']:.2f} ms late at p99 (limit "
            f"{v['timing_lag_limit_ms']:.1f} ms)")


_MORE_CLIENTS = "split the load over more processes (--workers N)"


def _sentence(v: dict, n: int, max_concurrency: int | None, burst: bool) -> str:
    if burst:
        noun = "request was" if n == 1 else f"{n} requests were"
        return f"The {noun} released at once; the last went out {v['send_lag_max_ms']:.1f} ms after its time."
    dispatch, timing = _dispatch_clause(v), v["timing_kept_up"]
    late_clocks = "so measured TTFTs and ITLs include that much client-side delay"
    if not v["dispatch_kept_up"] and timing is False:
        return (f"The client could not keep up, in dispatch and in timing: {dispatch}, so the server saw less load "
                f"than asked; and {_timing_clause(v)}, {late_clocks}. Lower --rate or {_MORE_CLIENTS}.")
    if not v["dispatch_kept_up"]:
        measured = "" if timing is None else f"; timing kept up: {_timing_clause(v)}"
        if (v["dispatch_ratio"] or 0.0) >= KEPT_UP_RATIO:
            return (f"The client could not keep up: dispatch kept the rate but not the schedule, {dispatch}, so the "
                    f"server saw the right load with burstier arrivals than asked{measured}. Lower --rate or "
                    f"{_MORE_CLIENTS}.")
        return (f"The client could not keep up: dispatch fell behind, {dispatch}, so the server saw less load "
                f"than asked{measured}. Lower --rate or {_MORE_CLIENTS}.")
    if timing is False:
        return (f"Dispatch kept up, timing did not: {dispatch}, but {_timing_clause(v)}, {late_clocks}. "
                f"For exact latencies lower --rate or {_MORE_CLIENTS}.")
    wait = v["concurrency_wait_p99_ms"]
    if max_concurrency and wait is not None and wait > LAG_TOLERANCE_MS:
        achieved, scheduled = v["achieved_rate"] or 0.0, v["scheduled_rate"] or 0.0
        return (f"The --max-concurrency {max_concurrency} cap held requests back (wait p99 {wait:.0f} ms), so the "
                f"server saw {achieved:.1f} req/s of the {scheduled:.1f} req/s scheduled; the client kept up "
                f"(send lag p50 {v['send_lag_p50_ms']:.2f} ms, p99 {v['send_lag_p99_ms']:.2f} ms).")
    timed = "" if timing is None else f"; timing too: {_timing_clause(v)}"
    return f"The client kept up: dispatch on schedule, {dispatch}{timed}."


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


def timing_lag_limit_ms(median_ttft_ms: float | None) -> float:
    """The loop lag past which the client's clock, not the server, shaped the latencies: a tenth of the median
    TTFT, or a fixed floor for the loop's timer granularity and jitter."""
    return max(TIMING_TOLERANCE_MS, TIMING_TTFT_FRACTION * (median_ttft_ms or 0.0))


def _median_ttft_ms(sent: list[RequestOutcome]) -> float | None:
    ttfts = [request_metrics(o).ttft for o in sent if o.ok and o.token_times]
    return float(np.median(ttfts) * 1000.0) if ttfts else None


def judge(outcomes: list[RequestOutcome], start: float, max_concurrency: int | None = None,
          loop_lags: Sequence[float] = ()) -> ClientVerdict:
    sent = [o for o in outcomes if o.dispatched > 0]
    scheduled = np.array([o.scheduled for o in sent])
    dispatched = np.array([o.dispatched - start for o in sent])
    posted = np.array([o.sent - start for o in sent if o.sent > 0])
    lag = dispatched - scheduled
    wait = np.array([o.sent - o.dispatched for o in sent if o.sent > 0])
    loop = np.asarray(loop_lags, dtype=float)
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
        "send_lag_limit_ms": send_lag_limit_ms(scheduled_rate),
        "loop_lag_p50_ms": _ms(loop, 50),
        "loop_lag_p99_ms": _ms(loop, 99),
        "timing_lag_limit_ms": timing_lag_limit_ms(_median_ttft_ms(sent)),
    }
    # NOTE: a rate shortfall counts only once it amounts to real lateness; over a short span a millisecond of
    # jitter on the last send would otherwise read as a slow client.
    fell_behind = ratio is not None and ratio < KEPT_UP_RATIO and v["send_lag_max_ms"] > v["send_lag_limit_ms"]
    late = bool(sent) and v["send_lag_p99_ms"] > v["send_lag_limit_ms"]
    v["dispatch_kept_up"] = bool(burst or not (fell_behind or late))
    v["timing_kept_up"] = None if not len(loop) else bool(v["loop_lag_p99_ms"] <= v["timing_lag_limit_ms"])
    v["client_bottleneck"] = not v["dispatch_kept_up"]
    v["client_verdict"] = _sentence(v, len(sent), max_concurrency, burst) if sent else "No request was sent."
    return ClientVerdict(**v)
