"""`client.bottleneck` reads the client's own verdict from `toolkit bench` records (built here by the bench
package itself), and falls back to rates and send lag, allowing for sampling noise, for other tools' records."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.bench.arrivals import schedule
from toolkit.bench.benchmark import Measurement
from toolkit.bench.output import append_record
from toolkit.bench.outcome import RequestOutcome
from toolkit.bench.assemble import build_record
from toolkit.bench.runner import RunResult
from toolkit.bench.verdict import LAG_TOLERANCE_MS
from toolkit.bench.workload import Workload
from toolkit.diagnose import analyze
from toolkit.bench.record import BenchRecord
from toolkit.diagnose.bench_input import BenchInput, read_bench
from tests.diagnose.logfactory import Log

START = 1000.0
VERDICT_KEYS = ("scheduled_rate", "dispatch_ratio", "send_lag_p50_ms", "send_lag_max_ms", "concurrency_wait_p99_ms",
                "client_bottleneck", "client_verdict")


def _outcomes(offsets: np.ndarray, lag_s: float, wait_s: float, drift_s: float) -> list[RequestOutcome]:
    outcomes = []
    for i, offset in enumerate(offsets):
        out = RequestOutcome(i, float(offset), 16)
        out.dispatched = START + offset + lag_s + i * drift_s
        out.sent = out.dispatched + i * wait_s
        out.token_times, out.token_counts = [out.sent + 0.05, out.sent + 0.07], [1, 1]
        out.output_len, out.ended = 2, out.sent + 0.08
        outcomes.append(out)
    return outcomes


def bench_record(rate: float, n: int, *, seed: int = 0, lag_ms: float = 0.5, wait_ms: float = 0.0,
                 drift_ms: float = 0.0, max_concurrency: int | None = None) -> dict:
    """A `toolkit bench` record of a Poisson run at `rate`, as `bench.assemble.build_record` writes it."""
    offsets = schedule(rate, num_requests=n, seed=seed)
    outcomes = _outcomes(offsets, lag_ms / 1000.0, wait_ms / 1000.0, drift_ms / 1000.0)
    duration = max(o.ended for o in outcomes) - START
    run = RunResult(outcomes, START, 1.7e9, 1.7e9 + duration, duration, False)
    workload = Workload([], offsets, rate, "poisson")
    return build_record({"backend": "sglang"}, Measurement(run, 0, [], None), workload, slo_ms={},
                        max_concurrency=max_concurrency, server_log=None, details=False)


def client_findings(*records: dict) -> list:
    bench = BenchInput("records", tuple(BenchRecord.from_json(r) for r in records))
    d = analyze(lines=Log().decode_series(5).lines, bench=bench)
    return [f for f in d.findings if f.id == "client.bottleneck"]


def _short_unlucky_poisson_seed(rate: float, n: int) -> int:
    return next(s for s in range(100) if schedule(rate, num_requests=n, seed=s)[-1] > (n - 1) / (0.85 * rate))


def test_short_poisson_run_that_kept_up_is_not_a_client_bottleneck() -> None:
    record = bench_record(10.0, 20, seed=_short_unlucky_poisson_seed(10.0, 20))
    assert record["achieved_rate"] < 0.9 * record["request_rate"]  # the nominal-rate comparison's false alarm
    assert record["client_bottleneck"] is False
    assert client_findings(record) == []


@pytest.mark.parametrize("lag_ms,fires", [(LAG_TOLERANCE_MS - 1, False), (LAG_TOLERANCE_MS + 1, True)])
def test_client_verdict_decides_on_both_sides_of_its_lag_threshold(lag_ms: float, fires: bool) -> None:
    record = bench_record(20.0, 200, lag_ms=lag_ms)
    assert record["client_bottleneck"] is fires
    found = client_findings(record)
    assert bool(found) is fires
    if fires:
        assert found[0].message.startswith(record["client_verdict"])
        assert found[0].evidence.facts["send_lag_p99_ms"] == pytest.approx(lag_ms)


def test_client_falling_behind_its_schedule_is_a_bottleneck() -> None:
    record = bench_record(20.0, 200, drift_ms=2.0)
    assert record["dispatch_ratio"] < 0.99 and record["client_bottleneck"] is True
    assert [f.id for f in client_findings(record)] == ["client.bottleneck"]


def test_concurrency_cap_holding_requests_back_is_not_a_client_bottleneck() -> None:
    record = bench_record(20.0, 200, wait_ms=10.0, max_concurrency=4)
    assert record["achieved_rate"] < 0.9 * record["scheduled_rate"] and record["client_bottleneck"] is False
    assert client_findings(record) == []


@pytest.mark.parametrize("n,fires", [(20, False), (10_000, True)])
def test_records_without_a_verdict_allow_for_sampling_noise(n: int, fires: bool) -> None:
    record = {"request_rate": 10.0, "achieved_rate": 8.5, "num_requests": n, "send_lag_p99_ms": 3.0}
    assert bool(client_findings(record)) is fires


@pytest.mark.parametrize("lag_ms,fires", [(50.0, False), (51.0, True)])
def test_records_without_a_verdict_judge_send_lag(lag_ms: float, fires: bool) -> None:
    record = {"request_rate": 10.0, "achieved_rate": 10.0, "num_requests": 100, "send_lag_p99_ms": lag_ms}
    assert bool(client_findings(record)) is fires


def test_bench_jsonl_written_by_the_bench_package_is_read_with_its_verdict(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    append_record(path, bench_record(20.0, 200, lag_ms=LAG_TOLERANCE_MS + 5))
    append_record(path, {k: v for k, v in bench_record(10.0, 20).items() if k not in VERDICT_KEYS})
    runs = read_bench(str(path)).runs
    assert runs[0].client_bottleneck is True and runs[0].client_verdict and runs[0].num_requests == 200
    assert runs[1].client_bottleneck is None
    d = analyze(lines=Log().decode_series(5).lines, bench=str(path))
    assert [f.id for f in d.findings if f.id.startswith("client")] == ["client.bottleneck"]



@pytest.mark.parametrize("share,fires", [(0.8, False), (1.2, True)])
def test_send_lag_is_judged_against_the_gap_between_sends_at_low_rates(share: float, fires: bool) -> None:
    # NOTE: at ~1 req/s the mean gap is ~1 s: lateness up to a tenth of it leaves the arrival process intact.
    limit = bench_record(1.0, 400)["send_lag_limit_ms"]
    assert limit > 5 * LAG_TOLERANCE_MS
    record = bench_record(1.0, 400, lag_ms=share * limit)
    assert record["send_lag_limit_ms"] == pytest.approx(100.0 / record["scheduled_rate"])
    assert record["client_bottleneck"] is fires
    assert bool(client_findings(record)) is fires
