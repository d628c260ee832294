"""`toolkit bench --workers N` (local processes) and `--ray-address` (Ray tasks): one schedule split over N
senders, merged into one record computed from the union of their per-request samples."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.bench.stub import Script
from tests.server.server_process import children_of, cmdline
from toolkit.bench import eventloop
from toolkit.bench.arrivals import schedule
from toolkit.bench.split import split_cap, split_workload
from toolkit.bench.workload import Workload
from toolkit.cli import app

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

SMALL = ["--dataset", "random", "--random-input-len", "16", "--random-output-len", "4", "--seed", "3",
         "--arrival", "constant", "--no-progress"]
FAST = Script(ttft=0.005, chunks=((0.0, 1), (0.001, 1), (0.001, 1), (0.001, 1)))


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _percentile_ms(rows: list[dict], key: str, q: float) -> float:
    return float(np.percentile([r[key] for r in rows], q))


def assert_merged_from_union(record: dict, num_prompts: int, workers: int, backend: str) -> None:
    rows = record["requests"]
    assert record["workers"] == workers and record["worker_backend"] == backend
    assert record["completed"] == record["num_requests"] == num_prompts and record["failed"] == 0
    assert sorted(r["index"] for r in rows) == list(range(num_prompts))
    # the record's percentiles are those of the union of every worker's per-request samples
    for stat, q in (("median", 50), ("p90", 90), ("p99", 99)):
        assert record[f"{stat}_ttft_ms"] == pytest.approx(_percentile_ms(rows, "ttft_ms", q))
        assert record[f"{stat}_e2e_latency_ms"] == pytest.approx(_percentile_ms(rows, "e2e_ms", q))
    itls = [gap for r in rows for gap in r["itl_ms"]]
    assert record["median_itl_ms"] == pytest.approx(float(np.median(itls)), abs=1e-3)
    per_worker = record["per_worker"]
    assert [w["worker"] for w in per_worker] == list(range(workers))
    assert sum(w["completed"] for w in per_worker) == sum(w["sent"] for w in per_worker) == num_prompts
    # worker w sent arrivals w, w + N, ...: the global schedule, every N-th send each
    assert all(abs(r["send_lag_ms"]) < 50 for r in rows)
    assert all(w["ready_before_start_ms"] > 0 for w in per_worker)


def test_two_workers_merge_into_one_record_from_the_union_of_samples(tmp_path, threaded_stub):
    out, rate, n = tmp_path / "runs.jsonl", 100.0, 40
    with threaded_stub(default=FAST) as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", str(n), "--rate", f"{rate:g}",
                       "--workers", "2", "--output-file", str(out), "--output-details")
        served = len(stub.served)
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert served == n + 1  # one warm-up request, sent once by the parent
    assert_merged_from_union(record, n, 2, "process")
    assert record["achieved_rate"] == pytest.approx(rate, rel=0.05)
    assert record["scheduled_rate"] == pytest.approx(rate)
    for worker in record["per_worker"]:
        assert worker["sent"] == n // 2 and worker["scheduled_rate"] == pytest.approx(rate / 2)
        assert worker["achieved_rate"] == pytest.approx(rate / 2, rel=0.05)


def test_one_worker_is_the_default_path_with_the_same_keys(tmp_path, threaded_stub):
    default, one = tmp_path / "default.jsonl", tmp_path / "one.jsonl"
    with threaded_stub(default=FAST) as stub:
        plain = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "6", "--rate", "100",
                      "--output-file", str(default))
        single = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "6", "--rate", "100",
                       "--workers", "1", "--output-file", str(one))
    assert plain.exit_code == 0 and single.exit_code == 0, single.output
    [a], [b] = records(default), records(one)
    assert a.keys() == b.keys()
    assert b["workers"] == 1 and b["worker_backend"] is None and len(b["per_worker"]) == 1
    assert b["per_worker"][0]["completed"] == b["completed"] == 6


def test_ray_address_without_ray_is_a_one_line_usage_error(monkeypatch, threaded_stub):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "2", "--workers", "2",
                       "--ray-address", "127.0.0.1:6379")
    assert result.exit_code == 2
    assert "pip install 'toolkit[ray]'" in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0, result.output


def test_ray_workers_merge_into_one_record(tmp_path, threaded_stub):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'toolkit[ray]')")
    out, n = tmp_path / "runs.jsonl", 20
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    try:
        address = ray.get_runtime_context().gcs_address
        with threaded_stub(default=FAST) as stub:
            result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", str(n), "--rate", "50",
                           "--workers", "2", "--ray-address", address, "--output-file", str(out),
                           "--output-details")
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert_merged_from_union(record, n, 2, "ray")


def test_the_split_keeps_every_arrival_at_its_global_time():
    offsets = schedule(50.0, num_requests=7, arrival="poisson", seed=2)
    workload = Workload(list(range(7)), offsets, 50.0, "poisson")
    shares = split_workload(workload, 3)
    assert [s.prompts for s in shares] == [[0, 3, 6], [1, 4], [2, 5]]
    assert np.array_equal(np.sort(np.concatenate([s.offsets for s in shares])), offsets)
    assert np.array_equal(shares[1].offsets, offsets[[1, 4]])
    sessions = split_workload(Workload(list(range(8)), offsets[:4], 50.0, "poisson", turns=2), 2)
    assert [s.prompts for s in sessions] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [split_cap(5, 2, w) for w in range(2)] == [3, 2] and split_cap(None, 2, 0) is None


def test_max_concurrency_below_one_slot_per_worker_is_refused(threaded_stub):
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "2", "--workers", "3",
                       "--max-concurrency", "2")
    assert result.exit_code == 2 and "one slot per worker" in result.output


def _bench_process(url: str, out: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "toolkit.cli", "bench", "--base-url", url, *SMALL, "--workers", "2",
               "--warmup-requests", "0", "--output-file", str(out), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), f"not within {timeout} s"


def _finish(process: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out + err


def test_ctrl_c_to_the_parent_alone_reaches_the_workers_and_keeps_their_samples(tmp_path, threaded_stub):
    out, slow = tmp_path / "runs.jsonl", Script(ttft=0.005, chunks=((0.0, 1), (0.2, 1), (0.2, 1), (0.2, 1)))
    with threaded_stub(default=slow) as stub:
        process = _bench_process(stub.base_url, out, "--num-prompts", "400", "--rate", "20")
        _wait_for(lambda: len(stub.served) >= 20, timeout=60)  # both workers are sending
        process.send_signal(signal.SIGINT)  # the parent only, as `kill -INT` would (a terminal signals all)
        code, output = _finish(process)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output
    [record] = records(out)
    assert record["interrupted"] and record["workers"] == 2
    # what finished is kept, what was in flight is counted as cancelled, the rest was never sent
    assert 0 < record["completed"] < 400 and record["cancelled"] > 0 and record["duration"] < 30
    assert all(w["sent"] > 0 for w in record["per_worker"])


def test_a_terminals_ctrl_c_to_the_whole_group_keeps_the_samples(tmp_path, threaded_stub):
    """Each worker gets the terminal's SIGINT and the parent's pass-on, one after the other: the second must not
    find Python's KeyboardInterrupt waiting once the first has ended the worker's run."""
    out, slow = tmp_path / "runs.jsonl", Script(ttft=0.005, chunks=((0.0, 1), (0.2, 1), (0.2, 1), (0.2, 1)))
    with threaded_stub(default=slow) as stub:
        process = _bench_process(stub.base_url, out, "--num-prompts", "400", "--rate", "20")
        _wait_for(lambda: len(stub.served) >= 20, timeout=60)
        os.killpg(process.pid, signal.SIGINT)
        code, output = _finish(process)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output
    [record] = records(out)
    assert record["interrupted"] and 0 < record["completed"] < 400


def test_on_ctrl_c_puts_back_the_handler_it_found():
    """A worker ignores Ctrl-C outside its run; after the run's handler it ignores it again (the loop alone would
    leave Python's default, which raises KeyboardInterrupt)."""
    assert threading.current_thread() is threading.main_thread()  # signal handlers are the main thread's

    async def one_run() -> None:
        with eventloop.on_ctrl_c(lambda: None):
            assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN

    found = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        eventloop.run(one_run())
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, found)


def test_a_worker_that_dies_ends_the_run_with_one_clear_line(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=FAST) as stub:
        process = _bench_process(stub.base_url, out, "--num-prompts", "400", "--rate", "20")
        _wait_for(lambda: len(stub.served) >= 10, timeout=60)
        workers = children_of(process.pid)
        spawned = [pid for pid in workers if "spawn_main" in cmdline(pid)]
        assert len(spawned) == 2, [cmdline(pid) for pid in workers]
        os.kill(spawned[0], signal.SIGKILL)
        code, output = _finish(process)
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "a --workers process died during the run" in errors[0], output[-3000:]
    assert "Traceback" not in output and not out.exists()
