"""A run over time: the steady window (ramp-up and drain cut off) and fixed-width time slices (pure; seconds).

Times are seconds from the run start. The steady window is drawn on the arrival schedule: it opens at the scheduled
send of the first request after the first `RAMP_FRACTION` of them (those fill the server: ramp-up) and closes at the
last scheduled send (after it the load only drains); a burst has none. A request counts in the window by its
scheduled send for latencies, by its end for completions; tokens count by their arrival. Slices cut the whole run
into `width`-second pieces on the same rules, except that a request counts in the slice it was really sent in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.bench.metrics import distribution, itls, request_metrics
from toolkit.bench.outcome import RequestOutcome
from toolkit.runtime.io_struct import STATS_METRICS

RAMP_FRACTION = 0.1
DEFAULT_SLICE_SECONDS = 10.0
RUNNING = (STATS_METRICS["num_running_reqs"].sample, "vllm:num_requests_running")
QUEUED = (STATS_METRICS["num_queue_reqs"].sample, "vllm:num_requests_waiting")


@dataclass(frozen=True, slots=True)
class Timed:
    """A run's requests on the run clock: sends of all sent, and for the completed their latencies and tokens."""

    sends: np.ndarray
    done_sends: np.ndarray
    schedule: np.ndarray
    done_schedule: np.ndarray
    ends: np.ndarray
    ttfts: np.ndarray
    tpots: np.ndarray
    e2es: np.ndarray
    token_times: np.ndarray
    token_counts: np.ndarray
    itl_times: np.ndarray
    itls: np.ndarray


def _itl_times(out: RequestOutcome) -> list[float]:
    # NOTE: aligned with `metrics.itls`: one entry per token after the first, stamped with its event's arrival.
    return [t for t, k in zip(out.token_times, out.token_counts) for _ in range(k)][1:]


def timed(outcomes: list[RequestOutcome], start: float) -> Timed:
    sent = [o for o in outcomes if o.dispatched > 0 and o.sent > 0]
    done = [o for o in sent if o.ok]
    metrics = [request_metrics(o) for o in done]
    arr = np.asarray
    return Timed(
        sends=np.sort(arr([o.sent - start for o in sent], dtype=float)),
        done_sends=arr([o.sent - start for o in done], dtype=float),
        schedule=np.sort(arr([o.scheduled for o in sent], dtype=float)),
        done_schedule=arr([o.scheduled for o in done], dtype=float),
        ends=arr([o.ended - start for o in done], dtype=float),
        ttfts=arr([m.ttft for m in metrics], dtype=float),
        tpots=arr([math.nan if m.tpot is None else m.tpot for m in metrics], dtype=float),
        e2es=arr([m.e2e for m in metrics], dtype=float),
        token_times=arr([t - start for o in done for t in o.token_times], dtype=float),
        token_counts=arr([k for o in done for k in o.token_counts], dtype=float),
        itl_times=arr([t - start for o in done for t in _itl_times(o)], dtype=float),
        itls=arr([g for o in done for g in itls(o.token_times, o.token_counts)], dtype=float),
    )


def _inside(times: np.ndarray, t0: float, t1: float, closed: bool = False) -> np.ndarray:
    return (times >= t0) & ((times <= t1) if closed else (times < t1))


def _pct_ms(seconds: np.ndarray, q: float) -> float | None:
    return float(np.percentile(seconds, q) * 1000.0) if len(seconds) else None


def steady_window(schedule: np.ndarray) -> tuple[float, float] | None:
    """[t0, t1] from the sorted scheduled sends: from the one that ends the ramp-up to the last; None when that
    leaves no time (a burst)."""
    if len(schedule) < 2:
        return None
    t0 = float(schedule[min(math.ceil(RAMP_FRACTION * len(schedule)), len(schedule) - 1)])
    t1 = float(schedule[-1])
    return (t0, t1) if t1 > t0 else None


def steady(t: Timed, started_at: float) -> dict | None:
    """The `steady` block: the window, its counts and throughputs, and the latencies of the requests sent in it."""
    window = steady_window(t.schedule)
    if window is None:
        return None
    t0, t1 = window
    width, by_send = t1 - t0, _inside(t.done_schedule, t0, t1, closed=True)
    block = {
        "t0": t0, "t1": t1, "started_at": started_at + t0, "ended_at": started_at + t1,
        "requests": int(_inside(t.schedule, t0, t1, closed=True).sum()),
        "completed": int(_inside(t.ends, t0, t1, closed=True).sum()),
        "request_throughput": float(_inside(t.ends, t0, t1, closed=True).sum()) / width,
        "output_throughput": float(t.token_counts[_inside(t.token_times, t0, t1, closed=True)].sum()) / width,
    }
    tpots = t.tpots[by_send]
    block |= distribution("ttft", list(t.ttfts[by_send]))
    block |= distribution("tpot", list(tpots[~np.isnan(tpots)]))
    block |= distribution("itl", list(t.itls[_inside(t.itl_times, t0, t1, closed=True)]))
    block |= distribution("e2e_latency", list(t.e2es[by_send]))
    return block


def _gauge(scraped: list[dict], names: tuple[str, ...]) -> float | None:
    for sample in reversed(scraped):
        for name in names:
            if name in sample["metrics"]:
                return sample["metrics"][name]
    return None


def _slice(t: Timed, t0: float, t1: float, scraped: list[dict], last: bool) -> dict:
    width, by_send = t1 - t0, _inside(t.done_sends, t0, t1, last)
    itl, sends = t.itls[_inside(t.itl_times, t0, t1, last)], int(_inside(t.sends, t0, t1, last).sum())
    row = {
        "t0": t0, "t1": t1, "sent": sends, "completed": int(_inside(t.ends, t0, t1, last).sum()),
        "request_rate": sends / width,
        "output_throughput": float(t.token_counts[_inside(t.token_times, t0, t1, last)].sum()) / width,
        "ttft_p50_ms": _pct_ms(t.ttfts[by_send], 50), "ttft_p99_ms": _pct_ms(t.ttfts[by_send], 99),
        "itl_p50_ms": _pct_ms(itl, 50), "itl_p99_ms": _pct_ms(itl, 99),
    }
    for key, names in (("running", RUNNING), ("queued", QUEUED)):
        value = _gauge(scraped, names)
        if value is not None:
            row[key] = value
    return row


def slices(t: Timed, duration: float, width: float, scraped: list[dict], started_at: float) -> list[dict]:
    """One row per `width` seconds of the run (the last one shorter, and closed at the run's end); `running` and
    `queued` from the last `/metrics` sample taken within the slice (the last slice also takes the closing sample),
    present only where one was taken and the server exposes the gauge."""
    count = max(1, math.ceil(duration / width - 1e-9)) if duration > 0 else 0
    rows = []
    for i in range(count):
        t0, t1, last = i * width, min((i + 1) * width, duration), i == count - 1
        inside = [s for s in scraped if t0 <= s["t"] - started_at and (last or s["t"] - started_at < t1)]
        rows.append(_slice(t, t0, t1, inside, last))
    return rows
