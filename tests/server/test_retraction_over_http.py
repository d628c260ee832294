"""Retraction through the real server: streams that live through a retraction deliver exactly the text and tokens
the same request gets alone (the detokenizer's offsets survive the re-prefill), and /metrics counts the
retractions the log reports."""
from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

WORDS = ["sea", "sky", "forest", "desert", "river", "mountain", "city", "garden", "moon", "star"]
PROMPTS = [f"Write item {i} of a long list about the {word}:" for i, word in enumerate(WORDS)]
# NOTE: short requests finish first and free room that the long ones, reserved at a tiny new-token ratio
# (--schedule-conservativeness 0.05), are then expected to need less of than they do: the pool runs dry.
MAX_TOKENS = [4, 32] * 5
POOL = 160
RETRACT_RE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+),")


@pytest.fixture(scope="module")
def small_pool_server(tmp_path_factory):
    log_file = tmp_path_factory.mktemp("retracting") / "server.log"
    process = ServerProcess("--device", "cpu", "--dtype", "float32", "--enable-metrics", "--max-total-tokens",
                            str(POOL), "--schedule-conservativeness", "0.05", "--decode-log-interval", "1",
                            log_file=log_file).wait_healthy()
    yield process
    process.stop()


def _metrics(server) -> dict[str, float]:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def _stream(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    text, finishes, usage = "", [], None
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event["choices"]:
                text += choice["text"]
                finishes += [choice["finish_reason"]] if choice["finish_reason"] else []
            usage = event.get("usage") or usage
    return {"text": text, "finishes": finishes, "usage": usage}


def test_streams_through_a_retraction_deliver_what_they_would_alone(small_pool_server):
    server = small_pool_server
    log_start = len(server.log_file.read_text())
    before = _metrics(server)

    async def run() -> list[dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await asyncio.gather(*[_stream(session, server.url, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)])

    streamed = asyncio.run(run())
    retractions = [int(m.group(1)) for m in RETRACT_RE.finditer(server.log_file.read_text()[log_start:])]
    assert retractions, "the small pool never forced a retraction: nothing here crossed one"
    after = _metrics(server)
    assert after["sglang:num_retracted_requests_total"] - before["sglang:num_retracted_requests_total"] == sum(
        retractions)
    assert after["sglang:num_retracted_reqs"] == retractions[-1]  # the gauge: the latest retraction's count
    for prompt, max_tokens, got in zip(PROMPTS, MAX_TOKENS, streamed):
        alone = requests.post(f"{server.url}/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}).json()
        assert got["text"] == alone["choices"][0]["text"], prompt
        assert got["finishes"] == ["length"] and got["usage"]["completion_tokens"] == max_tokens
    # NOTE: the last response can reach us before the scheduler's next turn releases its request: wait for it
    deadline = time.monotonic() + 30
    while (state := _state(server))["num_running_reqs"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (state["num_running_reqs"], state["num_queue_reqs"]) == (0, 0)
    assert state["num_used_tokens"] == 0, "every request's KV is free or cached once all are done"


def _state(server) -> dict:
    return requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_states"][0]
