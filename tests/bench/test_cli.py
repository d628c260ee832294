"""`toolkit bench` from the command line: records, rate lists, sweeps, keys, Ctrl-C, and one-line errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.bench.stub import Script
from toolkit.tune.launcher import free_port
from toolkit.cli import app

SGLANG_KEYS = ("request_throughput", "input_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
               "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms", "concurrency", "completed",
               "total_input_tokens", "total_output_tokens", "duration")
OWN_KEYS = ("backend", "base_url", "request_rate", "achieved_rate", "send_lag_p50_ms", "send_lag_p99_ms",
            "client_bottleneck", "client_verdict", "errors", "goodput", "started_at", "ended_at", "started_at_iso",
            "ended_at_iso", "server_log", "scraped_metrics", "p90_itl_ms", "std_e2e_latency_ms", "max_tpot_ms")
SMALL = ["--dataset", "random", "--random-input-len", "16", "--random-output-len", "4", "--seed", "3"]


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_help_lists_the_flags_without_importing_the_load_generator():
    result = bench("--help")
    assert result.exit_code == 0
    for flag in ("--base-url", "--backend", "--rate", "--arrival", "--burstiness", "--max-concurrency", "--sweep",
                 "--slo", "--scrape-metrics", "--server-log", "--output-file", "--output-details", "--dataset"):
        assert flag in result.output
    probe = "import sys, toolkit.cli; print(any(m.startswith(('toolkit.bench.command', 'aiohttp')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr


def test_a_run_appends_one_record_with_sglang_names_and_our_own(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, "--backend", "sglang-oai", *SMALL, "--num-prompts", "8",
                       "--rate", "200", "--slo", "ttft:1000 e2e:2000", "--scrape-metrics", "--scrape-interval",
                       "0.05", "--server-log", "/var/log/server.log", "--output-file", str(out), "--output-details")
        bodies = [s.body for s in stub.served]
    assert result.exit_code == 0, result.output
    [record] = records(out)
    for key in SGLANG_KEYS + OWN_KEYS:
        assert key in record, key
    assert record["completed"] == 8 and record["errors"] == {} and record["request_rate"] == 200.0
    assert record["model"] == "stub-model" and record["backend"] == "openai" and record["total_output_tokens"] == 16
    assert record["goodput"] == pytest.approx(record["request_throughput"]) and record["slo"]["e2e"] == 2000
    assert record["server_log"] == "/var/log/server.log"
    assert record["started_at"] < record["ended_at"] and record["started_at_iso"][:4].isdigit()
    assert record["scraped_metrics"] and "sglang:num_running_reqs" in record["scraped_metrics"][0]["metrics"]
    assert record["scraped_metrics"][0]["metrics"]["sglang:token_usage"] == pytest.approx(0.5)
    assert len(record["requests"]) == 8 and all(len(r["itl_ms"]) == 1 for r in record["requests"])
    assert all(b["max_tokens"] <= 4 and b["ignore_eos"] and b["model"] == "stub-model" for b in bodies)
    # Which verdict a loaded CI machine earns at 200 req/s varies (test_metrics pins each one); the record has one.
    assert "Request throughput" in result.output
    assert record["client_verdict"].startswith(("The client kept up", "The client could not", "Dispatch kept up"))


def test_a_rate_list_runs_each_rate_and_a_sweep_finds_saturation_first(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub() as stub:
        listed = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "4", "--rate", "100,200",
                       "--output-file", str(out))
        swept = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "6", "--sweep", "--output-file", str(out))
    assert listed.exit_code == 0 and swept.exit_code == 0, swept.output
    runs = records(out)
    assert [r["request_rate"] for r in runs[:2]] == [100.0, 200.0]
    assert [r["sweep"]["role"] for r in runs] == ["rate", "rate", "saturation"] + ["rate"] * 4
    saturation = runs[2]
    assert saturation["request_rate"] == "inf" and saturation["completed"] == 6
    below = [r["request_rate"] for r in runs[3:]]
    assert below == sorted(below) and below[-1] == pytest.approx(0.9 * saturation["request_throughput"], rel=0.01)


def test_max_concurrency_caps_requests_in_flight(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=Script(ttft=0.03)) as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "6", "--rate", "inf",
                       "--max-concurrency", "2", "--warmup-requests", "0", "--output-file", str(out))
        most = stub.max_in_flight
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert most == 2 and record["max_concurrency"] == 2 and record["completed"] == 6
    assert record["concurrency_wait_p99_ms"] > 50 and record["request_rate"] == "inf"


def test_trace_replay_from_a_mooncake_file(tmp_path, threaded_stub):
    out, sample = tmp_path / "runs.jsonl", Path(__file__).resolve().parents[2] / "traces/mooncake/sample.jsonl"
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, "--dataset", "trace", "--dataset-path", str(sample),
                       "--trace-time-scale", "0.002", "--num-prompts", "10", "--output-file", str(out))
        first = stub.served[1].body
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert record["arrival"] == "trace" and record["completed"] == 10 and record["total_input_tokens"] > 10
    assert len(first["input_ids"]) == 947 and first["sampling_params"]["max_new_tokens"] == 117


def test_the_api_key_is_sent_and_a_wrong_one_is_a_clear_error(threaded_stub):
    with threaded_stub(api_key="s3cret") as stub:
        good = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "2", "--api-key", "s3cret")
        bad = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "2", "--api-key", "wrong")
    assert good.exit_code == 0, good.output
    assert bad.exit_code == 2 and "401" in bad.output and "--api-key" in bad.output


def test_every_request_failing_exits_non_zero_but_still_reports(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=Script(status=500)) as stub:
        result = bench("--base-url", stub.base_url, *SMALL, "--num-prompts", "3", "--output-file", str(out))
    assert result.exit_code == 1
    assert records(out)[0]["errors"] == {"http_500": 4 - 1}


def test_ctrl_c_stops_the_run_and_keeps_what_was_measured(tmp_path, threaded_stub):
    dataset, out = tmp_path / "prompts.jsonl", tmp_path / "runs.jsonl"
    texts = ["fast one", "fast two", "slow one", "slow two"]
    dataset.write_text("".join(json.dumps({"prompt": t, "output_len": 2}) + "\n" for t in texts))
    scripts = {t: Script(ttft=0.005 if t.startswith("fast") else 60.0) for t in texts}
    with threaded_stub(scripts) as stub:
        def interrupt_when_the_slow_ones_are_in_flight():
            deadline = time.monotonic() + 10
            while sum(s.key.startswith("slow") for s in stub.served) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_when_the_slow_ones_are_in_flight, daemon=True).start()
        result = bench("--base-url", stub.base_url, "--dataset", "custom", "--dataset-path", str(dataset),
                       "--rate", "50", "--warmup-requests", "0", "--output-file", str(out))
    assert result.exit_code == 130, result.output
    [record] = records(out)
    assert record["interrupted"] and record["completed"] == 2 and record["cancelled"] == 2
    assert record["duration"] < 30  # the slow ones would answer after 60 s


@pytest.mark.parametrize("args, message", [
    (["--dataset", "nope"], "--dataset 'nope': choose one of"),
    (["--backend", "grpc"], "--backend 'grpc': choose one of"),
    (["--arrival", "uniform"], "--arrival 'uniform'"),
    (["--slo", "latency:5"], "--slo 'latency:5': the metric must be one of"),
    (["--slo", "ttft=5"], "--slo 'ttft=5'"),
    (["--slo", "[bold]ttft:x"], "--slo '[bold]ttft:x'"),
    (["--rate", "1,x,4"], "--rate '1,x,4': expected a number"),
    (["--rate", "-2"], "every rate must be positive"),
    (["--extra-request-body", "{oops"], "--extra-request-body is not valid JSON"),
    (["--dataset", "custom", "--dataset-path", "/no/such/file.jsonl"], "no such file"),
    (["--sweep", "--rate", "4"], "--sweep finds its own rates"),
    (["--num-prompts", "3", "--duration", "2"], "not both"),
    (["--random-range-ratio", "2"], "--random-range-ratio must be within"),
    (["--base-url", "localhost:30000"], "must start with http://"),
    ([], "cannot reach"),
])
def test_bad_input_is_one_clear_line_and_exit_code_two(args, message):
    base = ["--base-url", f"http://127.0.0.1:{free_port()}"]
    result = bench(*base, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_errors_found_after_contacting_the_server_are_one_line_too(threaded_stub, tmp_path):
    bad_trace = tmp_path / "trace.jsonl"
    bad_trace.write_text("{}\n")
    with threaded_stub() as stub:
        duration = bench("--base-url", stub.base_url, *SMALL, "--duration", "2")
        trace = bench("--base-url", stub.base_url, "--dataset", "trace", "--dataset-path", str(bad_trace))
        tokenizer = bench("--base-url", stub.base_url, "--tokenizer", str(tmp_path))
    assert duration.exit_code == 2 and "--duration needs a finite --rate" in duration.output
    assert trace.exit_code == 2 and "not a Mooncake trace row" in trace.output
    assert tokenizer.exit_code == 2 and "--tokenizer" in tokenizer.output
    for result in (duration, trace, tokenizer):
        assert "Traceback" not in result.output
