"""The workloads users run (issue 31): repeats with confidence intervals, the steady window and time slices, a sweep
that stops past saturation, and the Pareto front of a sweep, each end to end against the stub server."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tests.bench.stub import Script
from tests.bench.test_cli import SMALL, bench, records
from toolkit.bench.backends import read_tokens
from toolkit.bench.pareto import Point, front, pareto_record
from toolkit.bench.stats import mean_interval, metric, repeat_summary, t_critical
from toolkit.bench.sweep import Step, past_saturation, sweep

SERVICE = Script(ttft=0.05, chunks=((0.0, 1), (0.005, 1)))  # ~55 ms a request: one slot serves ~18 req/s


def test_t_critical_values_and_intervals_match_scipy():
    for df in (1, 2, 5, 10, 29, 30, 31, 45, 200, 5000):
        assert t_critical(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-4), df
    values = [101.0, 97.5, 103.2, 99.9, 100.4]
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))
    interval = mean_interval(values + [None, math.nan])
    assert interval.n == 5 and interval.mean == pytest.approx(np.mean(values))
    assert (interval.low, interval.high) == (pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))
    assert mean_interval([3.0]).as_record() == {"mean": 3.0, "ci_low": None, "ci_high": None, "half_width": None,
                                                "std": None, "n": 1}
    assert mean_interval([None]) is None


def test_repeats_use_fresh_seeds_and_the_last_record_carries_each_metrics_interval(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, "--backend", "openai", *SMALL, "--num-prompts", "5",
                       "--rate", "100", "--repeats", "3", "--warmup-requests", "0", "--output-file", str(out))
        prompts = [s.body["prompt"] for s in stub.served]
    assert result.exit_code == 0, result.output
    runs = records(out)
    assert [r["repeat"] for r in runs] == [{"index": i, "count": 3, "seed": 3 + i} for i in range(3)]
    assert [r["seed"] for r in runs] == [3, 4, 5]
    assert len(set(prompts)) == 15  # no repeat sends another's prompts, so none is served from a prefix cache
    assert "repeats" not in runs[0] and "repeats" not in runs[1]
    summary = runs[2]["repeats"]
    assert summary["count"] == 3 and summary["seeds"] == [3, 4, 5] and summary["confidence"] == 0.95
    throughputs = [r["output_throughput"] for r in runs]
    half = t_critical(2) * statistics.stdev(throughputs) / math.sqrt(3)
    assert summary["metrics"]["output_throughput"] == pytest.approx(
        {"mean": statistics.fmean(throughputs), "ci_low": statistics.fmean(throughputs) - half,
         "ci_high": statistics.fmean(throughputs) + half, "half_width": half,
         "std": statistics.stdev(throughputs), "n": 3})
    assert summary["metrics"]["steady.output_throughput"]["n"] == 3
    assert metric(runs[2], "output_throughput") == pytest.approx(statistics.fmean(throughputs))
    assert "Over 3 repeats: mean and 95% confidence interval" in result.output


def _sent_at(row: dict, record: dict) -> float:
    return row["sent_at"] - record["started_at"]


def test_the_steady_window_and_the_slices_come_from_the_requests_own_timestamps(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(capacity=4) as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--rate", "40", "--arrival", "constant", "--duration",
                       "1", "--slice-seconds", "0.25", "--scrape-metrics", "--scrape-interval", "0.05",
                       "--warmup-requests", "0", "--output-details", "--output-file", str(out))
    assert result.exit_code == 0, result.output
    [record] = records(out)
    rows = sorted(record["requests"], key=lambda r: r["sent_at"])
    steady, slices = record["steady"], record["slices"]
    assert len(rows) == 40 and record["slice_seconds"] == 0.25
    assert steady["t0"] == pytest.approx(0.1) == rows[4]["scheduled_ms"] / 1000  # the first 10 % are the ramp-up
    assert steady["t1"] == pytest.approx(0.975) == rows[-1]["scheduled_ms"] / 1000
    in_window = [r for r in rows if steady["t0"] - 1e-9 <= r["scheduled_ms"] / 1000 <= steady["t1"] + 1e-9]
    assert steady["requests"] == len(in_window) == 36
    assert steady["median_ttft_ms"] == pytest.approx(np.median([r["ttft_ms"] for r in in_window]))
    assert steady["request_throughput"] == pytest.approx(40, rel=0.2)

    assert len(slices) == math.ceil(record["duration"] / 0.25)
    assert sum(s["sent"] for s in slices) == 40 and sum(s["completed"] for s in slices) == 40
    tokens = sum(s["output_throughput"] * (s["t1"] - s["t0"]) for s in slices)
    assert tokens == pytest.approx(record["total_output_tokens"])
    for s in slices[:4]:
        assert s["request_rate"] == pytest.approx(40, rel=0.15)
        sent = [r["ttft_ms"] for r in rows if s["t0"] <= _sent_at(r, record) < s["t1"]]
        assert s["ttft_p50_ms"] == pytest.approx(np.percentile(sent, 50))
        assert s["ttft_p99_ms"] == pytest.approx(np.percentile(sent, 99))
        assert "running" in s and "queued" in s
    assert "Steady window" in result.output


def test_slices_have_no_server_gauges_without_scraping(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "4", "--rate", "inf",
                       "--output-file", str(out))
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert record["steady"] is None  # a burst has no steady window
    assert [set(s) & {"running", "queued"} for s in record["slices"]] == [set()]
    assert record["slices"][0]["sent"] == 4


def test_a_rate_list_stops_once_a_run_is_past_saturation(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=SERVICE, capacity=1) as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--rate", "4,60,120", "--arrival", "constant",
                       "--duration", "1", "--slice-seconds", "0.25", "--warmup-requests", "0",
                       "--output-file", str(out))
        rates_served = len(stub.served)
    assert result.exit_code == 0, result.output
    calm, saturated = records(out)
    assert rates_served == 4 + 60  # the 120 req/s run never went out
    assert "stopped_early" not in calm and past_saturation(calm) is None
    stop = saturated["stopped_early"]
    assert stop["rate"] == 60 and stop["skipped"] == [120] and stop["reason"].startswith("TTFT p50 grew")
    ttfts = [s["ttft_p50_ms"] for s in saturated["slices"] if s["ttft_p50_ms"] is not None]
    assert ttfts[-1] > 3 * ttfts[0] and saturated["steady"]["request_throughput"] < 0.9 * 60
    assert "Stopped early at rate 60 req/s, past saturation" in result.output
    assert saturated["pareto"]["points"] == 2 and "Pareto front" in result.output


def _record(rate: float, ttft_first: float, ttft_last: float, completed: float) -> dict:
    slices = [{"ttft_p50_ms": ttft_first}, {"ttft_p50_ms": None}, {"ttft_p50_ms": ttft_last}]
    return {"request_rate": rate, "scheduled_rate": rate, "slices": slices,
            "steady": {"request_throughput": completed}, "interrupted": False}


def test_past_saturation_needs_both_growing_ttft_and_a_completion_shortfall():
    assert past_saturation(_record(10, 50, 400, 6)).startswith("TTFT p50 grew from 50 ms")
    assert past_saturation(_record(10, 50, 400, 9.5)) is None  # slow, but keeping up
    assert past_saturation(_record(10, 50, 140, 6)) is None  # behind, but the queue is not growing
    assert past_saturation({"slices": [{"ttft_p50_ms": 5}], "scheduled_rate": 1, "request_throughput": 0}) is None


def test_early_stop_skips_only_higher_rates_and_can_be_turned_off():
    def measure(step: Step) -> dict:
        return _record(step.rate, 50, 400 if step.rate >= 8 else 60, 6 if step.rate >= 8 else step.rate)

    emitted: list[dict] = []
    stopped = sweep(measure, [2.0, 8.0, 4.0, 16.0], False, emitted.append)
    assert [r["request_rate"] for r in stopped] == [2.0, 8.0, 4.0] and emitted == stopped
    assert stopped[1]["stopped_early"]["skipped"] == [16.0]
    every = sweep(measure, [2.0, 8.0, 4.0, 16.0], False, stop_past_saturation=False)
    assert [r["request_rate"] for r in every] == [2.0, 8.0, 4.0, 16.0]
    assert not any("stopped_early" in r for r in every)


def test_the_pareto_front_keeps_the_runs_no_other_run_beats_on_both_axes():
    points = [Point(1, 100.0, 50.0), Point(2, 90.0, 120.0), Point(3, 95.0, 100.0), Point(4, 60.0, 110.0),
              Point(5, 40.0, 200.0), Point(6, 40.0, 150.0)]
    assert [p.request_rate for p in front(points)] == [1, 3, 2, 5]
    runs = [{"request_rate": 1, "mean_tpot_ms": 10.0, "output_throughput": 50.0},
            {"request_rate": 2, "mean_tpot_ms": 20.0, "output_throughput": 40.0},
            {"request_rate": 4, "repeat": {"index": 0}, "mean_tpot_ms": 1.0, "output_throughput": 900.0},
            {"request_rate": 4, "repeat": {"index": 1}, "mean_tpot_ms": 25.0, "output_throughput": 80.0,
             "repeats": repeat_summary([{"mean_tpot_ms": 1.0, "output_throughput": 900.0},
                                        {"mean_tpot_ms": 25.0, "output_throughput": 80.0}])}]
    pareto = pareto_record(runs)
    assert pareto["points"] == 3  # the repeats of rate 4 count once, at their means
    front_runs = [(p["request_rate"], p["per_user_output_throughput"]) for p in pareto["front"]]
    assert front_runs == [(1, 100.0), (4, 1000 / 13)]


def test_help_lists_the_workload_flags():
    result = bench("--help")
    for flag in ("--repeats", "--slice-seconds", "--early-stop", "--no-early-stop"):
        assert flag in result.output, flag


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats"),
    (["--slice-seconds", "0"], "--slice-seconds must be positive"),
    (["--find-max-rate", "--slo", "ttft:100", "--repeats", "2"], "drop --repeats"),
])
def test_bad_workload_flags_are_one_line_errors(args, message):
    result = bench("--base-url", "http://127.0.0.1:9", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_record_reports_the_servers_cached_prompt_tokens_as_a_cache_hit_rate(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=Script(cached_tokens=6)) as stub:
        cached = bench("--base-url", stub.base_url, "--backend", "openai-chat", *SMALL, "--num-prompts", "4",
                       "--rate", "inf", "--output-file", str(out))
        prompt_tokens = [s.prompt_tokens for s in stub.served[1:]]
    with threaded_stub() as stub:
        silent = bench("--base-url", stub.base_url, "--backend", "openai", *SMALL, "--num-prompts", "2",
                       "--output-file", str(out))
    assert cached.exit_code == 0 and silent.exit_code == 0, cached.output + silent.output
    reported, unreported = records(out)
    assert reported["cached_tokens"] == 4 * 6
    assert reported["cache_hit_rate"] == pytest.approx(24 / sum(prompt_tokens))
    assert unreported["cached_tokens"] is None and unreported["cache_hit_rate"] is None
    native = read_tokens("sglang", [(0.0, {"text": "a", "meta_info": {"completion_tokens": 1, "cached_tokens": 5}})])
    assert native.cached_tokens == 5
