"""Process lifecycle: SIGTERM stops everything quickly (open streams get an error event and [DONE], the KV is
freed, exit 0; a second signal exits at once), a dead scheduler fails /health and the server exits non-zero, the
watchdog catches a stuck forward pass, and --api-key guards every endpoint but /health and never reaches a log."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import aiohttp
import openai
import pytest
import requests

from tests.machine_speed import scaled
from tests.server.conftest import API_KEY
from tests.server.server_process import ServerProcess, alive, family

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

TINY = ("--max-total-tokens", "4096")


# NOTE: "within a few seconds": the bound is ample for a loaded 2-core machine; a server that waits for its
# requests or hangs blows through it (the streams below ask for 1000 tokens each).
EXIT_BOUND_S = 15.0


def test_sigterm_exits_promptly_leaving_no_children():
    server = ServerProcess(*TINY).wait_healthy()
    children = family(server.pid)
    assert children, "the scheduler process should be a child of the server"
    requests.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(30)
    elapsed = time.monotonic() - started
    server.stop()
    assert elapsed < scaled(EXIT_BOUND_S), f"took {elapsed:.1f} s"
    assert code == 0
    assert not _wait_gone(children), "child processes outlived the server"


def _wait_gone(children: dict[int, int | None], seconds: float = 2.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(pid, started) for pid, started in children.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid, started in children.items() if alive(pid, started)]


STREAM_BODIES = [
    ("/v1/completions", {"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 1000,
                              "ignore_eos": True, "stream": True}),
    ("/generate", {"text": "Tell me a long story.", "stream": True,
                   "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}),
]


async def _open_stream(session: aiohttp.ClientSession, url: str, i: int, first_event: asyncio.Event,
                       opened: list[int]) -> list[str]:
    path, body = STREAM_BODIES[i % len(STREAM_BODIES)]
    events = []
    async with session.post(url + path, json=body) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if not events:
                opened.append(i)
                if len(opened) == 20:
                    first_event.set()
            events.append(line[6:])
    return events


def test_sigterm_with_20_open_streams_ends_every_stream_and_exits_0_promptly(tmp_path):
    log = tmp_path / "server.log"

    async def run(server: ServerProcess) -> tuple[float, list[list[str]], list[int | str]]:
        first_event, opened = asyncio.Event(), []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            streams = [asyncio.ensure_future(_open_stream(session, server.url, i, first_event, opened))
                       for i in range(20)]
            await asyncio.wait_for(first_event.wait(), 120)
            server.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            late = []
            try:
                async with session.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
                    late.append(r.status)
                    assert "shutting down" in (await r.json())["error"]["message"]
            except aiohttp.ClientConnectionError:
                late.append("refused")
            ended = await asyncio.wait_for(asyncio.gather(*streams), 30)
            return started, ended, late

    with ServerProcess("--max-total-tokens", "30000", log_file=log).wait_healthy() as server:
        children = family(server.pid)
        started, ended, late = asyncio.run(run(server))
        code = server.proc.wait(30)
        elapsed = time.monotonic() - started
    text = log.read_text()
    assert code == 0 and elapsed <= scaled(EXIT_BOUND_S), f"exit code {code} after {elapsed:.1f} s"
    for events in ended:
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert "shutting down" in error["message"] and error["code"] == 503, events[-2]
    assert late in ([503], ["refused"]), late
    assert not _wait_gone(children), "child processes outlived the server"
    assert "memory leak" not in text and "Traceback" not in text
    assert "Shutting down: new requests get 503, aborted 20 requests" in text, text[-2000:]
    assert "Scheduler shut down: aborted 20 requests, KV pool free: True" in text, text[-2000:]


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once(second):
    prompt = list(range(100, 3100))  # one 3000-token prefill keeps the scheduler busy for seconds on a CPU

    def post(url: str) -> None:
        try:
            requests.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}},
                          timeout=60)
        except requests.RequestException:
            pass

    with ServerProcess("--dtype", "float32", "--chunked-prefill-size", "-1", "--max-total-tokens", "8192",
                       "--watchdog-timeout", "120").wait_healthy() as server:
        children = family(server.pid)
        thread = threading.Thread(target=post, args=(server.url,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while requests.get(f"{server.url}/get_server_info", timeout=10).json()["num_pending_http_requests"] == 0:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "Received SIGTERM; shutting down" not in server.output():  # the first one was handled
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.05)
        server.proc.send_signal(second)
        started = time.monotonic()
        code = server.proc.wait(30)
        elapsed = time.monotonic() - started
        output = server.output()
    thread.join(60)
    # the exit code tells the hard exit (128 + signal) from a graceful one (0); the bound is ample
    assert code == 128 + second and elapsed < scaled(EXIT_BOUND_S), f"exit code {code} after {elapsed:.1f} s:\n{output[-2000:]}"
    assert f"Received {signal.Signals(second).name} again" in output
    assert not _wait_gone(children), "child processes outlived the server"


def test_killed_scheduler_fails_health_and_the_server_exits_nonzero():
    server = ServerProcess(*TINY).wait_healthy()
    os.kill(server.scheduler_pid(), signal.SIGKILL)
    statuses = server.health_until_exit(10)
    code = server.proc.wait(10)
    output = server.output()
    server.stop()
    assert 503 in statuses, f"/health never failed: {statuses[-5:]}"
    assert code != 0
    assert "Received sigquit from a child process" in output
    assert "Future exception was never retrieved" not in output and "zmq.error.Again" not in output, output[-3000:]


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


def _route_table() -> list[tuple[str, str]]:
    """(method, path) of every route the server registers (HEAD mirrors GET; the catch-all as an unknown path)."""
    from toolkit.runtime.server.http_server import build_app

    app = build_app(SimpleNamespace(args=SimpleNamespace(api_key="k")))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD":
            continue
        routes.add(("get", "/no/such/route") if "{" in path else (route.method.lower(), path))
    return sorted(routes)


ROUTES = _route_table()


def test_the_route_table_is_the_one_these_tests_walk():
    assert len(ROUTES) >= 12 and ("get", "/health") in ROUTES and ("get", "/no/such/route") in ROUTES


@pytest.mark.parametrize("method, path", [r for r in ROUTES if r[1] != "/health"])
def test_api_key_is_required_on_every_route_but_health(keyed_server, method, path):
    call = getattr(requests, method)
    response = call(keyed_server.url + path, json={}, timeout=10)
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    wrong = call(keyed_server.url + path, json={}, timeout=10, headers={"Authorization": "Bearer sk-test-12"})
    assert wrong.status_code == 401
    right = call(keyed_server.url + path, json={}, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"})
    assert right.status_code not in (401, 403) and right.status_code < 500, (right.status_code, right.text[:300])


def test_health_is_open_and_the_key_works(keyed_server):
    assert requests.get(f"{keyed_server.url}/health", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=API_KEY, max_retries=0)
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=3)
    assert result.usage.completion_tokens == 3
    denied = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        denied.models.list()


@pytest.mark.parametrize("header", [f"bearer {API_KEY}", f"BEARER {API_KEY}", f"Bearer  {API_KEY}"])
def test_the_bearer_scheme_is_case_insensitive(keyed_server, header):
    response = requests.get(f"{keyed_server.url}/v1/models", headers={"Authorization": header}, timeout=10)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("header", [API_KEY, f"Basic {API_KEY}", f"Bearer {API_KEY}x", "Bearer", "Bearer \u00e9\u00e9"])
def test_other_credentials_are_refused(keyed_server, header):
    response = requests.get(f"{keyed_server.url}/v1/models", headers={"Authorization": header.encode("latin-1")},
                            timeout=10)
    assert response.status_code == 401, response.text


def test_the_api_key_never_reaches_the_log_or_a_response(keyed_server):
    info = requests.get(f"{keyed_server.url}/get_server_info", headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=10)
    assert info.json()["api_key"] == "***" and API_KEY not in info.text
    text = keyed_server.log_file.read_text() + keyed_server.output()
    assert "api_key='***'" in text
    assert API_KEY not in text
