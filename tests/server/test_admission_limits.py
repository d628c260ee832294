"""Overload is shed, not queued for ever: with `--max-queued-requests` a request that would overfill the waiting
queue gets 503 at once (OpenAI-style body naming the limit, Retry-After) on every generation endpoint, streaming or
not, while the admitted ones complete; with `--queue-timeout` a request that waited too long is answered 503 and
freed. /metrics counts both under SGLang's `sglang:num_queue_rejected_requests_total{reason=...}`, and the log says so.

Each test holds the one running slot (`--max-running-requests 1`) with a long stream that it closes at the end, so
what waits and what is shed does not depend on how fast this machine decodes."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.machine_speed import scaled
from tests.server.server_process import ServerProcess
from toolkit.runtime.server.admission import ShedLog, over_limit, queued
from toolkit.runtime.server_args import ServerArgs, parse_server_args

FLAGS = ("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "4096", "--max-running-requests", "1",
         "--enable-metrics", "--decode-log-interval", "1000")
TIMEOUT = 30  # seconds, on every request
USER = [{"role": "user", "content": "hi"}]
# (path, body): one of each endpoint, streamed and not
PROBES = [
    ("/v1/completions", {"prompt": "Say hi", "max_tokens": 4}),
    ("/v1/completions", {"prompt": "Say hi", "max_tokens": 4, "stream": True}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "stream": True}),
    ("/generate", {"text": "Say hi", "sampling_params": {"max_new_tokens": 4}}),
    ("/generate", {"text": "Say hi", "sampling_params": {"max_new_tokens": 4}, "stream": True}),
]


class RunningStream:
    """A long stream, read until its first token: it runs, and keeps running until `close` (the server aborts it).
    NOTE: the line iterator is kept: dropping it releases the connection, which aborts the request."""

    def __init__(self, server: ServerProcess) -> None:
        body = {"prompt": "Tell me a long story.", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        self.response = requests.post(f"{server.url}/v1/completions", json=body, stream=True, timeout=TIMEOUT)
        assert self.response.status_code == 200
        self.lines = self.response.iter_lines()
        assert next(line for line in self.lines if line.startswith(b"data: {"))

    def close(self) -> None:
        self.response.close()


def _load(server: ServerProcess) -> dict:
    (replica,) = requests.get(f"{server.url}/get_load", timeout=TIMEOUT).json()
    return replica


def _wait_for(condition, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _rejected(server: ServerProcess) -> dict[str, float]:
    text = requests.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "sglang:num_queue_rejected_requests_total"}


def _short(server: ServerProcess, i: int) -> requests.Response:
    body = {"prompt": f"Queued request {i}:", "max_tokens": 3, "ignore_eos": True}
    return requests.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)


def test_the_limit_counts_waiting_requests_per_replica_and_admits_a_big_request_only_into_an_empty_queue():
    assert queued(open_requests=3, running=1) == 2 and queued(open_requests=1, running=2) == 0
    assert not over_limit(waiting=1, sequences=1, limit=2) and over_limit(waiting=2, sequences=1, limit=2)
    assert not over_limit(waiting=3, sequences=1, limit=2, replicas=2)  # 2 per replica
    assert not over_limit(waiting=0, sequences=5, limit=2) and over_limit(waiting=1, sequences=5, limit=2)
    assert not over_limit(waiting=0, sequences=1, limit=0) and over_limit(waiting=1, sequences=1, limit=0)
    assert not over_limit(waiting=99, sequences=1, limit=None)


def test_the_shed_log_writes_the_first_at_once_then_one_summary_per_interval():
    log = ShedLog(interval=10.0)
    log.count("queue_full", now=100.0)
    assert log.last_line == 100.0 and not log.pending
    log.count("queue_full", now=101.0)
    log.count("waiting_timeout", now=105.0)
    assert log.flush(now=109.0) is None
    assert log.flush(now=111.0) == ("Shed 2 requests in the last 11 s (503, Retry-After 1 s): queue_full: 1, "
                                    "waiting_timeout: 1")


@pytest.mark.parametrize("flags, message", [
    (["--max-queued-requests", "-1"], "--max-queued-requests must be >= 0"),
    (["--queue-timeout", "-2"], "--queue-timeout must be > 0 seconds"),
    (["--queue-timeout", "0"], "--queue-timeout must be > 0 seconds"),
])
def test_negative_limits_are_refused_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse_server_args(flags)
    assert message in capsys.readouterr().err
    assert ServerArgs(max_queued_requests=0, queue_timeout=0.5).max_queued_requests == 0


@pytest.mark.slow
def test_a_full_queue_sheds_with_503_and_retry_after_and_the_admitted_requests_complete():
    with ServerProcess(*FLAGS, "--max-queued-requests", "2").wait_healthy() as server:
        running = RunningStream(server)
        with ThreadPoolExecutor(2) as pool:
            queued = [pool.submit(_short, server, i) for i in range(2)]
            _wait_for(lambda: _load(server)["num_waiting_reqs"] == 2, "two queued requests")
            shed = []
            for path, body in PROBES:
                sent = time.perf_counter()
                response = requests.post(f"{server.url}{path}", json=body, timeout=TIMEOUT)
                shed.append((response, time.perf_counter() - sent))
            running.close()  # the server aborts it; the queued ones run
            answers = [future.result(timeout=TIMEOUT) for future in queued]
        for response, seconds in shed:
            error = response.json()["error"]
            assert response.status_code == 503 and response.headers["Retry-After"] == "1", response.text
            assert error["code"] == "queue_full" and error["type"] == "server_error"
            assert "--max-queued-requests 2" in error["message"]
            assert seconds < 5  # at once: never queued behind the running stream
        for answer in answers:
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
        assert _rejected(server) == {"queue_full": len(PROBES), "waiting_timeout": 0}
        assert _load(server)["num_waiting_reqs"] == 0
        assert "Shed 1 requests (503, Retry-After 1 s): queue_full: 1" in server.output()


@pytest.mark.slow
def test_a_request_that_waits_past_the_queue_timeout_gets_503_and_is_freed():
    with ServerProcess(*FLAGS, "--queue-timeout", "1").wait_healthy() as server:
        running = RunningStream(server)
        sent = time.perf_counter()
        answer = _short(server, 0)
        waited = time.perf_counter() - sent
        stream = requests.post(f"{server.url}/generate", timeout=TIMEOUT, json={
            "text": "Say hi", "sampling_params": {"max_new_tokens": 4}, "stream": True})
        assert _load(server)["num_reqs"] == 1  # only the running stream is left
        running.close()
        error = answer.json()["error"]
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1", answer.text
        assert error["code"] == "waiting_timeout" and "--queue-timeout" in error["message"]
        assert 1.0 <= waited < scaled(10)
        # a stream's headers went out before it timed out: an error event, then [DONE]
        events = [line for line in stream.text.splitlines() if line.startswith("data: ")]
        assert stream.status_code == 200 and events[-1] == "data: [DONE]"
        assert '"code": "waiting_timeout"' in events[-2]
        assert _rejected(server) == {"queue_full": 0, "waiting_timeout": 2}
        output = server.output()
        assert "Queue timeout: aborted 1 requests that waited more than 1 s" in output
        assert "waiting_timeout: 1" in output
