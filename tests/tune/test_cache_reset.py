"""Each repeat of a tune configuration starts from an empty prefix cache: `/flush_cache` (SGLang, ours) or
`/reset_prefix_cache` (vLLM); a refused flush is retried while the server drains, and a server without the
endpoint gets a fresh prompt seed per repeat instead. Unit level, against a tiny HTTP server on 127.0.0.1."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolkit.tune import workload as tune_workload
from toolkit.tune.workload import reset_prefix_cache


class Endpoint:
    """Answers POST `path` with the statuses in `answers` (the last one repeats); 404 on any other path."""

    def __init__(self, path: str, answers: list[int]) -> None:
        self.path, self.answers, self.hits = path, answers, 0


@pytest.fixture
def endpoint() -> Iterator[callable]:
    servers: list[ThreadingHTTPServer] = []

    def serve(path: str, answers: list[int]) -> tuple[str, Endpoint]:
        state = Endpoint(path, answers)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != state.path:
                    self.send_response(404)
                else:
                    status = state.answers[min(state.hits, len(state.answers) - 1)]
                    state.hits += 1
                    self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", state

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("engine,path", [("sglang", "/flush_cache"), ("vllm", "/reset_prefix_cache")])
def test_each_engine_is_asked_on_its_own_endpoint(endpoint, engine: str, path: str) -> None:
    url, state = endpoint(path, [200])
    assert reset_prefix_cache(url, engine) is True and state.hits == 1


def test_a_flush_refused_while_requests_drain_is_retried(endpoint, monkeypatch) -> None:
    monkeypatch.setattr(tune_workload.time, "sleep", lambda s: None)
    url, state = endpoint("/flush_cache", [400, 400, 200])
    assert reset_prefix_cache(url, "sglang") is True and state.hits == 3


def test_a_server_that_never_gets_idle_is_not_waited_on_forever(endpoint, monkeypatch) -> None:
    monkeypatch.setattr(tune_workload.time, "sleep", lambda s: None)
    url, state = endpoint("/flush_cache", [400])
    assert reset_prefix_cache(url, "sglang", tries=4) is False and state.hits == 4


def test_without_the_endpoint_each_repeat_gets_a_fresh_seed(endpoint, monkeypatch) -> None:
    from toolkit.bench.command import BenchOptions
    from toolkit.bench.datasets import DatasetSpec

    monkeypatch.setattr(tune_workload, "SETTLE_SECONDS", 0.0)
    url, state = endpoint("/elsewhere", [200])  # vLLM outside its dev mode: no /reset_prefix_cache
    server = type("S", (), {"url": url})()
    work = tune_workload.BenchWorkload(BenchOptions(base_url=url, dataset=DatasetSpec(seed=7)), "throughput", "vllm")
    assert [work.reset(server, repeat) for repeat in range(3)] == [("fresh-seed", 7), ("fresh-seed", 8),
                                                                    ("fresh-seed", 9)]
    flushing_url, _ = endpoint("/reset_prefix_cache", [200])
    flushing = type("S", (), {"url": flushing_url})()
    assert [work.reset(flushing, repeat) for repeat in range(2)] == [("reset_prefix_cache", 7)] * 2
