"""Scaling out behind SGLang's own router: a `toolkit serve` worker answers what sglang-router asks when it registers
a worker and routes to it (/health, /server_info, /model_info, /get_load, /v1/models, /flush_cache); through
`python -m sglang_router.launch_router` (skipped without sglang-router) two workers serve /v1/completions, requests
sharing a long prefix stay on one worker under cache_aware, and a SIGKILLed worker is routed around once the router
notices (that test kills worker 1, so it comes last)."""
from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Iterator

import pytest
import requests

from tests.server.router_process import NOT_INSTALLED, ROUTER_INSTALLED, RouterProcess, group_prompts, served_by
from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.slow

# NOTE: --enable-metrics: which worker served a request is read from its sglang:num_requests_total
FLAGS = ("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "8192", "--enable-metrics")
TIMEOUT = 30
ROUTER_STARTUP = 60.0
HEALTH_CHECK = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2")
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


needs_router = pytest.mark.skipif(not ROUTER_INSTALLED, reason=NOT_INSTALLED)


@pytest.fixture
def router(workers, tmp_path) -> Iterator[RouterProcess]:
    """cache_aware, checking its workers' health every second (2 failures mark one unhealthy)."""
    process = RouterProcess([w.url for w in workers], tmp_path / "router.out", "cache_aware", *HEALTH_CHECK)
    try:
        process.wait_workers({w.url: True for w in workers}, ROUTER_STARTUP)
        yield process
    finally:
        process.stop()


def _body(workers: list[ServerProcess], prompt: str) -> dict:
    model = _get(workers[0], "/v1/models").json()["data"][0]["id"]
    return {"model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True}


@needs_router
def test_two_workers_serve_completions_through_sglang_router(workers, router):
    urls = [w.url for w in workers]
    routed = [served_by(urls, lambda: router.post("/v1/completions", _body(workers, f"Routed request {i}:")))
              for i in range(4)]
    for answer, worker in routed:
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3, answer.text
        assert worker in (0, 1)  # a worker finished it


@needs_router
def test_requests_sharing_a_long_prefix_stay_on_one_worker_under_cache_aware(workers, router):
    urls = [w.url for w in workers]
    served: dict[int, list[int | None]] = {}
    for group, prompt in group_prompts(groups=3, per_group=4, words=300, rng=random.Random(0)):
        answer, worker = served_by(urls, lambda: router.post("/v1/completions", _body(workers, prompt)))
        assert answer.status_code == 200, answer.text
        served.setdefault(group, []).append(worker)
    shares = [Counter(on).most_common(1)[0][1] / len(on) for on in served.values()]
    assert sum(shares) / len(shares) >= 0.8, served


@needs_router
def test_a_sigkilled_worker_is_routed_around_once_the_router_notices(workers, router):
    # NOTE: kills worker 1 for good, so this test comes last in the module
    urls = [w.url for w in workers]
    os.killpg(workers[1].pid, signal.SIGKILL)
    router.wait_workers({urls[0]: True, urls[1]: False}, timeout=30)
    routed = [served_by(urls, lambda: router.post("/v1/completions", _body(workers, f"After the kill {i}:")))
              for i in range(6)]
    assert [(answer.status_code, worker) for answer, worker in routed] == [(200, 0)] * 6, \
        [answer.text[:200] for answer, _ in routed]
