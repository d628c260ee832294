"""`toolkit bench` end to end against the real `toolkit serve`, in all three API dialects and with an API key."""
from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.server.conftest import API_KEY
from toolkit.cli import app

INPUT_LEN, OUTPUT_LEN, PROMPTS = 24, 6, 6


def _bench(url: str, out, *extra: str, warmup: int = 1) -> dict:
    result = CliRunner().invoke(app, [
        "bench", "--base-url", url, "--dataset", "random", "--num-prompts", str(PROMPTS), "--rate", "inf",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
        "--warmup-requests", str(warmup),
        "--output-file", str(out), "--no-progress", "--request-timeout", "120", *extra,
    ])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text().splitlines()[-1])


@pytest.mark.parametrize("backend", ["sglang", "openai", "openai-chat"])
def test_bench_measures_our_server(server, tmp_path, backend):
    record = _bench(server.url, tmp_path / "run.jsonl", "--backend", backend, "--scrape-metrics")
    assert record["completed"] == PROMPTS and record["failed"] == 0
    assert record["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    if backend != "openai-chat":  # chat adds its template's tokens to the prompt
        assert record["total_input_tokens"] == PROMPTS * INPUT_LEN
    assert record["mean_ttft_ms"] > 0 and record["mean_tpot_ms"] > 0 and record["output_throughput"] > 0
    assert record["scraped_metrics"], "no /metrics samples were taken"
    assert "sglang:num_running_reqs" in record["scraped_metrics"][-1]["metrics"]


def _counters(server) -> dict[str, float]:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize("backend", ["sglang", "openai", "openai-chat"])
def test_bench_totals_equal_the_servers_own_counters(server, tmp_path, backend):
    """What the client counted is what the server counted for the run: requests, prompt and generated tokens
    (/metrics before and after; no warm-up request, nothing else runs meanwhile)."""
    before = _counters(server)
    record = _bench(server.url, tmp_path / "run.jsonl", "--backend", backend, warmup=0)
    after = _counters(server)

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert record["completed"] == delta("sglang:num_requests_total") == PROMPTS
    assert record["total_output_tokens"] == delta("sglang:generation_tokens_total")
    assert record["total_input_tokens"] == delta("sglang:prompt_tokens_total")
    assert delta("sglang:time_to_first_token_seconds_count") == record["completed"]
    # the server's latencies lie inside the client's: its mean TTFT is at most the client's
    assert delta("sglang:time_to_first_token_seconds_sum") / PROMPTS <= record["mean_ttft_ms"] / 1000


def test_bench_with_api_key(keyed_server, tmp_path):
    record = _bench(keyed_server.url, tmp_path / "keyed.jsonl", "--backend", "openai", "--api-key", API_KEY)
    assert record["completed"] == PROMPTS and record["failed"] == 0


def test_bench_without_the_key_stops_with_a_clear_error(keyed_server, tmp_path):
    result = CliRunner().invoke(app, [
        "bench", "--base-url", keyed_server.url, "--backend", "openai", "--dataset", "random", "--num-prompts", "3",
        "--random-input-len", "8", "--random-output-len", "2", "--warmup-requests", "0", "--no-progress",
    ])
    assert result.exit_code == 2
    assert "401 Unauthorized: pass the server's key with --api-key" in result.output
