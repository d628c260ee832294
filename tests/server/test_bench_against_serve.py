"""`toolkit bench` end to end against the real `toolkit serve`, in all three API dialects and with an API key."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.server.conftest import API_KEY
from toolkit.cli import app

INPUT_LEN, OUTPUT_LEN, PROMPTS = 24, 6, 6


def _bench(url: str, out, *extra: str) -> dict:
    result = CliRunner().invoke(app, [
        "bench", "--base-url", url, "--dataset", "random", "--num-prompts", str(PROMPTS), "--rate", "inf",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
        "--warmup-requests", "1",
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
