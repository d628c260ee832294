"""--schedule-policy and --max-running-requests through the real server, on a workload built to tell the policies
apart: with one running slot taken, a request with nothing cached queues first and one whose long prefix is in the
radix cache second. When the slot frees, fcfs admits the first, lpm the cached one; the log's next prefill and the
order the two finish in both show which. Greedy outputs cannot show this (they do not depend on the order)."""
from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.server_process import ServerProcess

SHARED = ("You are a careful assistant for a company that tunes LLM servers. Answer briefly, cite the flag you would "
          "change, and say what it costs. ")
CACHED, UNCACHED = SHARED + "Question: what does lpm do?", "Unrelated: name a prime number."
PREFILL_RE = re.compile(r"Prefill batch\. #new-seq: 1, #new-token: (\d+), #cached-token: (\d+),")
QUEUE_OF_TWO_RE = re.compile(r"Decode batch\. #running-req: 1, .*#queue-req: 2, #grammar-queue-req: 0$", re.MULTILINE)
RUNNING_RE = re.compile(r"Decode batch\. #running-req: (\d+),")


@pytest.fixture(scope="module", params=["fcfs", "lpm"])
def policy_server(request, tmp_path_factory):
    log_file = tmp_path_factory.mktemp(f"policy-{request.param}") / "server.log"
    process = ServerProcess("--device", "cpu", "--dtype", "float32", "--schedule-policy", request.param,
                            "--max-running-requests", "1", "--decode-log-interval", "1",
                            log_file=log_file).wait_healthy()
    yield request.param, process
    process.stop()


def _queued(server) -> int:
    return requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_states"][0]["num_queue_reqs"]


def _wait(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _generate(server, text: str, done: list[str]) -> None:
    response = requests.post(f"{server.url}/generate", timeout=120, json={
        "text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert response.status_code == 200, response.text
    done.append(text)


def test_policy_decides_which_queued_request_is_admitted_first(policy_server):
    policy, server = policy_server
    _generate(server, SHARED + "Warm the cache.", [])  # the shared prefix is now in the radix cache
    blocker = requests.post(f"{server.url}/v1/completions", stream=True, timeout=120, json={
        "prompt": "Count slowly from one to a thousand:", "max_tokens": 2000, "ignore_eos": True, "stream": True})
    lines = blocker.iter_lines()
    _wait(lambda: next(lines).startswith(b"data: "), "the blocker's first token")
    done: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_generate, server, UNCACHED, done)
        _wait(lambda: _queued(server) == 1, "the uncached request to queue")
        second = pool.submit(_generate, server, CACHED, done)
        _wait(lambda: _queued(server) == 2, "the cached request to queue")
        log_at = len(server.log_file.read_text())
        blocker.close()  # the client goes away: its request is aborted and the slot frees
        first.result(timeout=120), second.result(timeout=120)
    admitted = PREFILL_RE.search(server.log_file.read_text()[log_at:])
    cached_tokens = int(admitted.group(2))
    if policy == "lpm":
        # the shared prefix (~28 tokens) in whole 16-token pages (a CPU's default page size)
        assert done == [CACHED, UNCACHED] and cached_tokens >= 16, (done, admitted.group(0))
    else:
        assert done == [UNCACHED, CACHED] and cached_tokens == 0, (done, admitted.group(0))


def test_max_running_requests_holds_through_the_server(policy_server):
    """The same run's log: one request ran at a time while two waited."""
    _, server = policy_server
    text = server.log_file.read_text()
    assert QUEUE_OF_TWO_RE.search(text), "no decode step ran with two requests queued"
    assert max(int(n) for n in RUNNING_RE.findall(text)) == 1
    info = requests.get(f"{server.url}/get_server_info", timeout=10).json()
    assert info["max_running_requests"] == 1
