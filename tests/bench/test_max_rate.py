"""`--find-max-rate`: the search on its own (pure) and against a stub of known capacity."""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from tests.machine_speed import scaled
from tests.bench.stub import Script
from toolkit.tune.launcher import free_port
from toolkit.bench.max_rate import TOLERANCE, Bracket, SearchSettings, find_max_rate, meets_slo
from toolkit.cli import app

# 4 slots, 0.2 s of service per request: at most 20 requests/s.
SLOTS, SERVICE = 4, Script(ttft=0.05, chunks=((0.0, 1), (0.05, 1), (0.05, 1), (0.05, 1)))
CAPACITY = SLOTS / 0.2


def _threshold_probe(limit: float, calls: list[float]):
    def probe(rate: float) -> bool:
        calls.append(rate)
        return rate <= limit
    return probe


@pytest.mark.parametrize("start", [1.0, 13.7, 50.0])
def test_the_search_brackets_the_limit_within_one_bisection_step(start):
    calls: list[float] = []
    bracket = find_max_rate(_threshold_probe(13.7, calls), start)
    assert bracket.lo is not None and bracket.hi is not None
    assert bracket.lo <= 13.7 < bracket.hi and bracket.hi / bracket.lo - 1 <= TOLERANCE
    assert len(calls) <= SearchSettings().max_runs and bracket.probes == [(r, r <= 13.7) for r in calls]


def test_the_search_never_runs_more_than_it_may():
    calls: list[float] = []
    bracket = find_max_rate(_threshold_probe(1e9, calls), 1.0, SearchSettings(max_runs=3))
    assert calls == [1.0, 2.0, 4.0] and bracket.lo == 4.0 and bracket.hi is None


def test_a_probe_that_says_stop_ends_the_search_and_reports_each_answer():
    answers = iter([True, False, None, True])
    seen: list[tuple[float | None, float | None]] = []
    bracket = find_max_rate(lambda rate: next(answers), 10.0, on_result=lambda b: seen.append((b.lo, b.hi)))
    assert bracket.probes == [(10.0, True), (20.0, False)] and seen == [(10.0, None), (10.0, 20.0)]


def test_a_bracket_bisects_geometrically():
    bracket = Bracket()
    bracket.add(4.0, True)
    bracket.add(16.0, False)
    assert bracket.next_rate(2.0) == pytest.approx(8.0) and not bracket.narrow(0.1)


@pytest.mark.parametrize("record, ok", [
    ({"slo_attainment": 0.95, "completed": 10}, True),
    ({"slo_attainment": 0.85, "completed": 10}, False),
    ({"slo_attainment": 1.0, "completed": 0}, False),
    ({"completed": 10}, False),
])
def test_a_run_meets_the_slos_when_enough_requests_met_every_bound(record, ok):
    assert meets_slo(record, 0.9) is ok


def test_find_max_rate_finds_the_stub_capacity_within_one_bisection_step(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    started = time.monotonic()
    with threaded_stub(default=SERVICE, capacity=SLOTS) as stub:
        result = CliRunner().invoke(app, [
            "bench", "--base-url", stub.base_url, "--dataset", "random", "--random-input-len", "16",
            "--random-output-len", "4", "--num-prompts", "32", "--arrival", "constant", "--warmup-requests", "0",
            "--slo", "ttft:100", "--find-max-rate", "--output-file", str(out)])
        most_served_at_once = stub.max_serving
    assert result.exit_code == 0, result.output
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert most_served_at_once == SLOTS
    assert runs[0]["search"]["role"] == "saturation" and runs[0]["request_rate"] == "inf"
    assert runs[0]["request_throughput"] == pytest.approx(CAPACITY, rel=0.15)
    last = runs[-1]["search"]
    lo, hi = last["max_rate"], last["bracket_hi"]
    assert lo is not None and hi is not None, runs[-1]["search"]
    assert CAPACITY / (1 + TOLERANCE) <= lo <= CAPACITY * 1.05 and hi >= CAPACITY * 0.95
    assert hi / lo - 1 <= TOLERANCE + 1e-9
    assert len(runs) <= 8 and all(r["search"]["meets_slo"] == (r["request_rate"] <= lo) for r in runs[1:])
    assert f"{lo:.3g} req/s" in result.output and time.monotonic() - started < scaled(60)


@pytest.mark.parametrize("args, message", [
    (["--find-max-rate"], "--find-max-rate needs at least one --slo"),
    (["--find-max-rate", "--slo", "ttft:100", "--sweep"], "give one of them"),
    (["--find-max-rate", "--slo", "ttft:100", "--rate", "1,2"], "at most one --rate"),
    (["--find-max-rate", "--slo", "ttft:100", "--slo-attainment", "1.5"], "--slo-attainment must be within"),
])
def test_find_max_rate_usage_errors_are_one_line(args, message):
    result = CliRunner().invoke(app, ["bench", "--base-url", f"http://127.0.0.1:{free_port()}", *args])
    assert result.exit_code == 2 and message in result.output, result.output
