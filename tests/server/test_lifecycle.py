"""Process lifecycle: SIGTERM stops everything quickly, a dead scheduler fails /health and the server exits
non-zero, the watchdog catches a stuck forward pass, and --api-key guards every endpoint but /health."""
from __future__ import annotations

import os
import signal
import time

import openai
import pytest
import requests

from tests.server.server_process import ServerProcess, alive, children_of

TINY = ("--dtype", "bfloat16", "--max-total-tokens", "4096")


def test_sigterm_exits_within_5_seconds_leaving_no_children():
    server = ServerProcess(*TINY).wait_healthy()
    children = children_of(server.proc.pid)
    assert children, "the scheduler process should be a child of the server"
    requests.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(10)
    elapsed = time.monotonic() - started
    server.stop()
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    assert code == 0
    deadline = time.monotonic() + 2
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)], "child processes outlived the server"


def test_killed_scheduler_fails_health_and_the_server_exits_nonzero():
    server = ServerProcess(*TINY).wait_healthy()
    os.kill(server.scheduler_pid(), signal.SIGKILL)
    statuses = []
    deadline = time.monotonic() + 10
    while server.proc.poll() is None and time.monotonic() < deadline:
        try:
            statuses.append(requests.get(f"{server.url}/health", timeout=1).status_code)
        except requests.ConnectionError:
            statuses.append("refused")
        time.sleep(0.05)
    code = server.proc.wait(10)
    log = server.log_tail()
    server.stop()
    assert 503 in statuses, f"/health never failed: {statuses[-5:]}"
    assert code != 0
    assert "Received sigquit from a child process" in log


def test_watchdog_kills_a_stuck_forward_pass(tmp_path):
    log = tmp_path / "watchdog.log"
    server = ServerProcess("--dtype", "float32", "--watchdog-timeout", "0.5", "--chunked-prefill-size", "-1",
                           "--max-total-tokens", "8192", log_file=log).wait_healthy()
    prompt = list(range(100, 3100))  # one 3000-token prefill takes seconds on a CPU
    try:
        requests.post(f"{server.url}/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}},
                      timeout=60)
    except requests.ConnectionError:
        pass
    code = server.proc.wait(30)
    server.stop()
    text = log.read_text()
    assert "Watchdog timeout (self.watchdog_timeout=0.5)" in text
    assert code != 0


@pytest.mark.parametrize("method, path", [("get", "/v1/models"), ("post", "/v1/completions"),
                                          ("post", "/generate"), ("get", "/get_server_info"), ("get", "/metrics"),
                                          ("post", "/flush_cache")])
def test_api_key_is_required_everywhere_but_health(keyed_server, method, path):
    response = getattr(requests, method)(keyed_server.url + path, json={}, timeout=10)
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    wrong = getattr(requests, method)(keyed_server.url + path, json={}, timeout=10,
                                      headers={"Authorization": "Bearer sk-test-12"})
    assert wrong.status_code == 401


def test_health_is_open_and_the_key_works(keyed_server):
    assert requests.get(f"{keyed_server.url}/health", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="sk-test-123", max_retries=0)
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=3)
    assert result.usage.completion_tokens == 3
    denied = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        denied.models.list()
