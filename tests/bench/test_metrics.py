"""Metric math, the client verdict, flag parsing and the sweep plan, on hand-made outcomes (no I/O)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from toolkit.bench.metrics import distribution, itls, request_metrics, summarize
from toolkit.bench.options import UsageError, parse_extra_body, parse_rates, parse_slo
from toolkit.bench.outcome import CANCELLED, RequestOutcome
from toolkit.bench.scrape import parse_metrics
from toolkit.bench.sweep import Step, rates_below, sweep
from toolkit.bench.verdict import judge


def _done(index, sent, token_times, counts, ended, scheduled=0.0, input_len=10, start=0.0):
    out = RequestOutcome(index, scheduled, input_len, dispatched=start + scheduled, sent=sent, ended=ended,
                         token_times=token_times, token_counts=counts, output_len=sum(counts))
    return out


def test_itls_spread_a_chunk_evenly_over_its_tokens():
    assert itls([1.0, 1.3, 1.4], [1, 3, 1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert itls([1.0, 1.2], [2, 2]) == pytest.approx([0.0, 0.1, 0.1])
    assert itls([1.0], [1]) == []


def test_request_metrics_follow_the_definitions():
    m = request_metrics(_done(0, sent=10.0, token_times=[10.05, 10.10, 10.25], counts=[1, 2, 3], ended=10.3))
    assert m.ttft == pytest.approx(0.05) and m.e2e == pytest.approx(0.3)
    assert m.tpot == pytest.approx((0.3 - 0.05) / 5)
    assert len(m.itls) == 5 and sum(m.itls) == pytest.approx(10.25 - 10.05)


def test_one_token_has_no_tpot():
    assert request_metrics(_done(0, 0.0, [0.1], [1], 0.1)).tpot is None


def test_summarize_counts_throughputs_and_concurrency():
    outcomes = [_done(0, 1.0, [1.1, 1.2], [1, 1], 1.2, input_len=5, start=1.0),
                _done(1, 1.5, [1.7, 2.0], [1, 3], 2.0, scheduled=0.5, input_len=7, start=1.0),
                RequestOutcome(2, 0.6, 3, dispatched=1.6, sent=1.6),
                RequestOutcome(3, 0.7, 3, dispatched=1.7, sent=1.7),
                RequestOutcome(4, 5.0, 3)]
    outcomes[2].fail("http_500", "x", 1.7)
    outcomes[3].fail(CANCELLED, "x", 1.8)
    s = summarize(outcomes, duration=2.0, slo_ms={"ttft": 150.0})
    assert (s["num_requests"], s["completed"], s["failed"], s["cancelled"]) == (4, 2, 1, 1)
    assert s["errors"] == {"http_500": 1}
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (12, 6)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 3.0 and s["input_throughput"] == 6.0
    assert s["concurrency"] == pytest.approx((0.2 + 0.5) / 2.0)
    assert s["mean_ttft_ms"] == pytest.approx(150.0) and s["max_ttft_ms"] == pytest.approx(200.0)
    assert s["median_e2e_latency_ms"] == pytest.approx(350.0)
    assert s["mean_itl_ms"] == pytest.approx(100.0) and s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["goodput"] == 0.5 and s["slo_attainment"] == 0.25


def test_distribution_names_and_empty_values():
    d = distribution("ttft", [0.001, 0.002, 0.003, 0.004])
    assert d["mean_ttft_ms"] == pytest.approx(2.5) and d["median_ttft_ms"] == pytest.approx(2.5)
    assert d["p99_ttft_ms"] == pytest.approx(3.97) and d["max_ttft_ms"] == pytest.approx(4.0)
    assert d["std_ttft_ms"] == pytest.approx(np.std([1, 2, 3, 4]))
    assert set(distribution("itl", [])) == {f"{s}_itl_ms" for s in ("mean", "median", "p90", "p99", "std", "max")}
    assert all(v is None for v in distribution("itl", []).values())


def _scheduled(n, rate, lag=0.0, wait=0.0, start=100.0):
    outs = []
    for i in range(n):
        out = RequestOutcome(i, i / rate, 1)
        out.dispatched = start + i / rate + lag
        out.sent = out.dispatched + wait
        outs.append(out)
    return outs


def test_verdict_says_the_client_kept_up():
    v = judge(_scheduled(100, 50.0, lag=0.0005), 100.0)
    assert not v.client_bottleneck and v.achieved_rate == pytest.approx(50.0)
    assert v.send_lag_p99_ms == pytest.approx(0.5) and v.client_verdict.startswith("The client kept up")


def test_verdict_blames_the_client_when_it_falls_behind():
    outs = _scheduled(100, 50.0)
    for i, out in enumerate(outs):
        out.dispatched += i * 0.002
        out.sent = out.dispatched
    v = judge(outs, 100.0)
    assert v.client_bottleneck and v.dispatch_ratio < 0.99
    assert v.client_verdict.startswith("The client could not keep up") and "Lower --rate" in v.client_verdict


def test_verdict_credits_the_concurrency_cap_not_the_client():
    outs = _scheduled(100, 50.0)
    for i, out in enumerate(outs):
        out.sent = out.dispatched + i * 0.01
    v = judge(outs, 100.0, max_concurrency=4)
    assert not v.client_bottleneck and v.concurrency_wait_p99_ms > 900
    assert "--max-concurrency 4 cap" in v.client_verdict and v.achieved_rate < 40


def test_verdict_for_an_all_at_once_burst():
    v = judge(_scheduled(5, math.inf), 100.0)
    assert not v.client_bottleneck and v.scheduled_rate is None and "released at once" in v.client_verdict


def test_rates_and_slo_parse_and_reject_bad_input():
    assert parse_rates("8") == [8.0] and parse_rates("1, 2,4") == [1.0, 2.0, 4.0]
    assert parse_rates("inf") == [math.inf]
    for bad in ("", "1,,2", "fast", "0", "-3", "nan"):
        with pytest.raises(UsageError, match="--rate"):
            parse_rates(bad)
    assert parse_slo(["ttft:200 tpot:50", "e2e:3000"]) == {"ttft": 200.0, "tpot": 50.0, "e2e": 3000.0}
    for bad in (["latency:3"], ["ttft"], ["ttft:abc"], ["ttft:-1"]):
        with pytest.raises(UsageError, match="--slo"):
            parse_slo(bad)
    assert parse_extra_body('{"a": 1}') == {"a": 1} and parse_extra_body(None) == {}
    for bad in ("{", "[1]"):
        with pytest.raises(UsageError, match="--extra-request-body"):
            parse_extra_body(bad)


def test_sweep_runs_saturation_then_rates_below_it():
    seen = []

    def measure(step: Step) -> dict:
        seen.append(step)
        return {"request_throughput": 40.0, "interrupted": False}

    records = sweep(measure, None, find_saturation=True)
    assert [s.rate for s in seen] == [math.inf, 10.0, 20.0, 30.0, 36.0] and len(records) == 5
    assert seen[0].role == "saturation" and {s.role for s in seen[1:]} == {"rate"}
    assert rates_below(3.333) == [0.833, 1.67, 2.5, 3.0]


def test_sweep_of_a_rate_list_stops_at_an_interrupt():
    seen = []

    def measure(step: Step) -> dict:
        seen.append(step.rate)
        return {"interrupted": step.rate == 2.0}

    assert len(sweep(measure, [1.0, 2.0, 4.0], find_saturation=False)) == 2 and seen == [1.0, 2.0]
    assert sweep(lambda step: {"rate": step.rate, "role": step.role}, None, False) == [
        {"rate": None, "role": "single"}]


def test_scraped_metrics_keep_server_series_and_aggregate_label_sets():
    text = ("# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:num_running_reqs{tp_rank="1"} 4\n'
            "# TYPE sglang:token_usage gauge\n"
            'sglang:token_usage{tp_rank="0"} 0.2\nsglang:token_usage{tp_rank="1"} 0.4\n'
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            'sglang:time_to_first_token_seconds_bucket{le="1.0"} 2\n'
            "sglang:time_to_first_token_seconds_sum 1.5\nsglang:time_to_first_token_seconds_count 2\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 9\n")
    assert parse_metrics(text) == {
        "sglang:num_running_reqs": 7.0, "sglang:token_usage": pytest.approx(0.3),
        "sglang:time_to_first_token_seconds_sum": 1.5, "sglang:time_to_first_token_seconds_count": 2.0}


def _with_ttft(outs, ttft):
    for out in outs:
        out.token_times, out.token_counts, out.output_len = [out.sent + ttft], [1], 1
        out.ended = out.sent + ttft
    return outs


def test_verdict_separates_dispatch_that_kept_up_from_timing_that_did_not():
    outs = _with_ttft(_scheduled(200, 2000.0, lag=0.0005), ttft=0.005)
    v = judge(outs, 100.0, loop_lags=[0.004] * 50 + [0.0001] * 50)
    assert v.dispatch_kept_up and not v.client_bottleneck and v.timing_kept_up is False
    assert v.timing_lag_limit_ms == pytest.approx(2.0) and v.loop_lag_p99_ms == pytest.approx(4.0)
    assert v.client_verdict.startswith("Dispatch kept up, timing did not") and "could not" not in v.client_verdict


def test_verdict_scales_the_timing_limit_with_the_ttft_and_says_both_kept_up():
    outs = _with_ttft(_scheduled(100, 50.0, lag=0.0005), ttft=0.2)
    v = judge(outs, 100.0, loop_lags=[0.004] * 100)
    assert v.timing_lag_limit_ms == pytest.approx(20.0) and v.timing_kept_up and v.dispatch_kept_up
    assert v.client_verdict.startswith("The client kept up") and "timing too" in v.client_verdict


def test_verdict_says_which_fact_failed_when_dispatch_falls_behind_but_timing_held():
    outs = _scheduled(100, 50.0)
    for i, out in enumerate(outs):
        out.dispatched += i * 0.002
        out.sent = out.dispatched
    v = judge(_with_ttft(outs, 0.05), 100.0, loop_lags=[0.0002] * 100)
    assert not v.dispatch_kept_up and v.timing_kept_up and v.client_bottleneck
    assert "dispatch fell behind" in v.client_verdict and "timing kept up" in v.client_verdict


def test_verdict_tells_late_sends_at_the_right_rate_from_a_rate_shortfall():
    outs = _scheduled(200, 100.0)
    for out in outs[::20]:
        out.dispatched += 0.05
        out.sent = out.dispatched
    v = judge(_with_ttft(outs, 0.05), 100.0, loop_lags=[0.0002] * 100)
    assert v.dispatch_ratio >= 0.99 and v.client_bottleneck
    assert "kept the rate but not the schedule" in v.client_verdict and "less load" not in v.client_verdict
