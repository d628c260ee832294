"""Latency and throughput math over finished requests (pure; all times in seconds, reported in ms).

Per-token accounting: an event carrying k tokens that arrives g seconds after the previous event contributes k
inter-token latencies of g/k; the extra tokens of the first event arrived with the first token (latency 0). So a
request has `output_len - 1` ITLs whose sum is the time from its first to its last token, and its mean ITL is its TPOT.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from toolkit.bench.outcome import CANCELLED, SHED, RequestOutcome

SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    ttft: float
    e2e: float
    tpot: float | None
    itls: list[float]
    input_len: int
    output_len: int

    def meets(self, slo_ms: dict[str, float]) -> bool:
        values = {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}
        return all(values[k] is None or values[k] * 1000 <= limit for k, limit in slo_ms.items())


def itls(times: list[float], counts: list[int]) -> list[float]:
    gaps = [0.0] * max(counts[0] - 1, 0)
    for previous, t, k in zip(times, times[1:], counts[1:]):
        gaps.extend([(t - previous) / k] * k)
    return gaps


def request_metrics(out: RequestOutcome) -> RequestMetrics:
    ttft, e2e = out.token_times[0] - out.sent, out.ended - out.sent
    tpot = (e2e - ttft) / (out.output_len - 1) if out.output_len > 1 else None
    return RequestMetrics(ttft, e2e, tpot, itls(out.token_times, out.token_counts), out.input_len, out.output_len)


def distribution(name: str, seconds: list[float]) -> dict[str, float | None]:
    """mean/median/p90/p99/std/max of `seconds`, in ms, under SGLang's bench_serving key names."""
    keys = [f"{stat}_{name}_ms" for stat in ("mean", "median", "p90", "p99", "std", "max")]
    if not seconds:
        return dict.fromkeys(keys)
    ms = np.asarray(seconds) * 1000.0
    values = (ms.mean(), np.median(ms), np.percentile(ms, 90), np.percentile(ms, 99), ms.std(), ms.max())
    return {k: float(v) for k, v in zip(keys, values)}


NOT_FAILURES = (None, CANCELLED, SHED)  # a request the server shed for load is counted apart, not as failed


def error_counts(outcomes: list[RequestOutcome]) -> dict[str, int]:
    return dict(Counter(o.error for o in outcomes if o.error not in NOT_FAILURES))


def cache_hits(done: list[RequestOutcome]) -> dict[str, float | int | None]:
    """Prompt tokens the server served from its prefix cache, and their share of the prompt tokens of the requests
    it reported them for (SGLang: `--enable-cache-report`); null when no response said."""
    reported = [o for o in done if o.cached_tokens is not None]
    cached, prompts = sum(o.cached_tokens for o in reported), sum(o.input_len for o in reported)
    return {"cached_tokens": cached if reported else None,
            "cache_hit_rate": cached / prompts if reported and prompts else None}


def summarize(outcomes: list[RequestOutcome], duration: float, slo_ms: dict[str, float] | None = None) -> dict:
    """The run's SGLang-named summary: counts, tokens, throughputs, concurrency, latency distributions, goodput."""
    sent = [o for o in outcomes if o.dispatched > 0]
    done = [request_metrics(o) for o in sent if o.ok]
    per_s = 1.0 / duration if duration > 0 else math.nan
    input_tokens, output_tokens = sum(m.input_len for m in done), sum(m.output_len for m in done)
    summary = {
        "num_requests": len(sent),
        "completed": len(done),
        "failed": sum(o.error not in NOT_FAILURES for o in sent),
        "shed": sum(o.error == SHED for o in sent),
        "cancelled": sum(o.error == CANCELLED for o in sent),
        "errors": error_counts(sent),
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) * per_s,
        "input_throughput": input_tokens * per_s,
        "output_throughput": output_tokens * per_s,
        "total_throughput": (input_tokens + output_tokens) * per_s,
        "concurrency": sum(m.e2e for m in done) * per_s,
    }
    summary |= cache_hits([o for o in sent if o.ok])
    summary |= distribution("ttft", [m.ttft for m in done])
    summary |= distribution("tpot", [m.tpot for m in done if m.tpot is not None])
    summary |= distribution("itl", [gap for m in done for gap in m.itls])
    summary |= distribution("e2e_latency", [m.e2e for m in done])
    if slo_ms:
        good = sum(m.meets(slo_ms) for m in done)
        summary |= {"goodput": good * per_s, "slo_attainment": good / len(sent) if sent else None}
    return summary
