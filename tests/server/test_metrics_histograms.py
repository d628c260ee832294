"""/metrics histograms as SGLang exports them (its bucket bounds, so its dashboards work), and their values bound
by what the client measured: the server's latency of a request is never longer than the client's, so every bucket
counts at least the requests the client saw under its bound, and each `_sum` at most the client's total."""
from __future__ import annotations

import time

import requests
from prometheus_client.parser import text_string_to_metric_families

# SGLang's metrics collector (0.4.x and later): a dashboard built on its bounds reads ours
SGLANG_BUCKETS = {
    "sglang:time_to_first_token_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400),
    "sglang:inter_token_latency_seconds": (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04,
                                           0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8),
    "sglang:e2e_request_latency_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
                                           800),
}
REQUESTS, TOKENS = 4, 6


def _histograms(server) -> dict[str, dict]:
    """{name: {"buckets": {le: count}, "count": n, "sum": s}} from one scrape."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        h = out.setdefault(family.name, {"buckets": {}})
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                h["buckets"][float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_count"):
                h["count"] = sample.value
            elif sample.name.endswith("_sum"):
                h["sum"] = sample.value
    return out


def _timed_stream(server, i: int) -> tuple[float, float]:
    """(client TTFT, client E2E) of one streamed request."""
    body = {"prompt": f"Histogram request {i}:", "max_tokens": TOKENS, "ignore_eos": True, "stream": True,
            "temperature": 0}
    sent = time.perf_counter()
    first = None
    with requests.post(f"{server.url}/v1/completions", json=body, stream=True, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith(b"data: {") and first is None:
                first = time.perf_counter()
    return first - sent, time.perf_counter() - sent


def test_histograms_have_sglang_buckets_and_count_what_the_client_saw(server):
    before = _histograms(server)
    for name, bounds in SGLANG_BUCKETS.items():
        assert sorted(before[name]["buckets"]) == [*map(float, bounds), float("inf")], name
    client = [_timed_stream(server, i) for i in range(REQUESTS)]
    after = _histograms(server)

    def delta(name: str) -> dict:
        b, a = before[name], after[name]
        return {"count": a["count"] - b["count"], "sum": a["sum"] - b["sum"],
                "buckets": {le: a["buckets"][le] - b["buckets"][le] for le in a["buckets"]}}

    ttft, itl, e2e = (delta(n) for n in SGLANG_BUCKETS)
    assert (ttft["count"], e2e["count"], itl["count"]) == (REQUESTS, REQUESTS, REQUESTS * (TOKENS - 1))
    for h, measured in ((ttft, [t for t, _ in client]), (e2e, [e for _, e in client])):
        counts = [h["buckets"][le] for le in sorted(h["buckets"])]
        assert counts == sorted(counts) and counts[-1] == h["count"], "buckets are cumulative up to +Inf"
        for le, count in h["buckets"].items():
            assert count >= sum(m <= le for m in measured), f"bucket le={le}: {count} < the client's"
        assert 0 < h["sum"] <= sum(measured)
    assert 0 < itl["sum"] <= sum(e for _, e in client)
