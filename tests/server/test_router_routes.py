"""Scaling out behind SGLang's own router: a `toolkit serve` worker answers what sglang-router asks when it registers
a worker and routes to it (/health, /server_info, /model_info, /get_load, /v1/models, /flush_cache), and two
workers serve /v1/completions through `python -m sglang_router.launch_router` (skipped without sglang-router)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server.server_process import ServerProcess
from toolkit.tune.launcher import free_port

pytestmark = pytest.mark.slow

FLAGS = ("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "4096")
TIMEOUT = 30
ROUTER_STARTUP = 60.0
# what sglang-router's worker registration reads (sgl-router: core/steps/worker/local), with the JSON type it expects
SERVER_INFO_FIELDS = {"model_path": str, "served_model_name": str, "dp_size": int, "version": str,
                      "max_running_requests": int, "max_prefill_tokens": int}
MODEL_INFO_FIELDS = {"model_path": str, "tokenizer_path": str, "is_generation": bool, "architectures": list}


@pytest.fixture(scope="module")
def workers() -> Iterator[list[ServerProcess]]:
    started = [ServerProcess(*FLAGS) for _ in range(2)]  # both load at once
    try:
        yield [worker.wait_healthy() for worker in started]
    finally:
        for worker in started:
            worker.stop()


def _get(worker: ServerProcess, path: str) -> requests.Response:
    response = requests.get(f"{worker.url}{path}", timeout=TIMEOUT)
    assert response.status_code == 200, (path, response.text)
    return response


def test_server_info_and_model_info_carry_what_the_router_registers_a_worker_by(workers):
    worker = workers[0]
    server_info, model_info = _get(worker, "/server_info").json(), _get(worker, "/model_info").json()
    for body, fields in ((server_info, SERVER_INFO_FIELDS), (model_info, MODEL_INFO_FIELDS)):
        for name, kind in fields.items():
            assert isinstance(body[name], kind), (name, body.get(name))
    model = _get(worker, "/v1/models").json()["data"][0]["id"]
    assert server_info["served_model_name"] == model_info["served_model_name"] == model
    assert model_info["is_generation"] is True and model_info["model_path"] == server_info["model_path"]
    assert server_info["dp_size"] == 1 and server_info["max_running_requests"] >= 1
    # the older names answer the same
    assert _get(worker, "/get_model_info").json() == model_info
    assert _get(worker, "/get_server_info").json()["model_path"] == server_info["model_path"]


def test_health_load_and_flush_answer_as_the_router_expects(workers):
    worker = workers[0]
    assert _get(worker, "/health").status_code == 200
    assert _get(worker, "/health_generate").status_code == 200
    [load] = _get(worker, "/get_load").json()
    assert load["dp_rank"] == 0 and load["num_waiting_reqs"] == 0
    assert all(isinstance(load[k], int) for k in ("num_reqs", "num_waiting_reqs", "num_tokens"))
    assert requests.post(f"{worker.url}/flush_cache", timeout=TIMEOUT).status_code == 200


class Router:
    """`python -m sglang_router.launch_router` in front of the workers, on 127.0.0.1 and a free port."""

    def __init__(self, worker_urls: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
                   "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(self.port),
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        self._output = open(log, "w")
        self.proc = subprocess.Popen(command, stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True)

    def complete(self, body: dict) -> requests.Response:
        return requests.post(f"{self.url}/v1/completions", json=body, timeout=TIMEOUT)

    def wait_ready(self, body: dict) -> None:
        """Until a completion goes through: the router is up and has registered a healthy worker."""
        deadline = time.monotonic() + ROUTER_STARTUP
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.complete(body).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"no completion went through the router:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._output.close()


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                    reason="sglang-router is not installed (pip install 'toolkit[router]')")
def test_two_workers_serve_completions_through_sglang_router(workers, tmp_path):
    router = Router([w.url for w in workers], tmp_path / "router.log")
    model = _get(workers[0], "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "Routed request:", "max_tokens": 3, "ignore_eos": True}
    before = sum(_completions(w) for w in workers)
    try:
        router.wait_ready(body)
        answers = [router.complete({**body, "prompt": f"Routed request {i}:"}) for i in range(4)]
    finally:
        router.stop()
    for answer in answers:
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3, answer.text
    assert sum(_completions(w) for w in workers) - before == 5  # the readiness probe and the 4, on the workers


def _completions(worker: ServerProcess) -> int:
    return worker.output().count('"POST /v1/completions HTTP/1.1" 200')
