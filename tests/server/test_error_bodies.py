"""What a client sees when the server itself fails or stops: a clear message, never a traceback, a path or an
exception's text; a draining server answers 503 to every new request."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest
import zmq
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from toolkit.runtime.io_struct import SchedulerFailed
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server.http_server import build_app, errors_middleware
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.state import ServerState
from toolkit.runtime.server.tokenizer_manager import SchedulerGone, TokenizerManager
from toolkit.runtime.server_args import ServerArgs

TRACEBACK = ('Traceback (most recent call last):\n  File "/home/me/secret/runtime/sampling/sampler.py", line 32, '
             'in seeded_generator\nValueError: Overflow when unpacking long long\n')


def _leaks(text: str) -> bool:
    return any(marker in text for marker in ("Traceback", "/home/me", "sampler.py", "Overflow"))


def test_a_scheduler_traceback_never_reaches_a_client():
    async def run() -> tuple[str, str]:
        endpoints = IpcEndpoints.fresh()
        manager = TokenizerManager(endpoints, tokenizer=None, metrics=None, stream_interval=1)
        context = zmq.Context()
        scheduler_inbox = context.socket(zmq.PULL)  # the scheduler's end, so that requests can be sent
        scheduler_inbox.connect(endpoints.to_scheduler)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    chunks = manager.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
                    break
                except SchedulerGone:  # until the connection is up
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
            assert scheduler_inbox.poll(10_000) and scheduler_inbox.recv_pyobj().input_ids == [1, 2, 3]
            manager._dispatch(SchedulerFailed(TRACEBACK))
            with pytest.raises(SchedulerGone) as in_flight:
                async for _ in chunks:
                    pass
            with pytest.raises(SchedulerGone) as later:
                manager.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            return str(in_flight.value), str(later.value)
        finally:
            manager.close()
            context.destroy(linger=0)
            endpoints.cleanup()

    for message in asyncio.run(run()):
        assert message and not _leaks(message), message


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_an_internal_error_answers_500_with_an_id_and_logs_the_details():
    async def boom(request: web.Request) -> web.Response:
        raise ValueError("/home/me/secret/runtime/sampling/sampler.py: Overflow")

    async def gone(request: web.Request) -> web.Response:
        raise SchedulerGone("the scheduler process died")

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_get("/boom", boom)
    app.router.add_get("/gone", gone)
    handler = _ListHandler()
    logging.getLogger("runtime").addHandler(handler)

    async def run() -> tuple[int, dict, int, dict]:
        async with TestClient(TestServer(app)) as client:
            failed = await client.get("/boom")
            dead = await client.get("/gone")
            return failed.status, await failed.json(), dead.status, await dead.json()

    try:
        status, body, dead_status, dead_body = asyncio.run(run())
    finally:
        logging.getLogger("runtime").removeHandler(handler)
    error = body["error"]
    assert status == 500 and error["type"] == "server_error" and not _leaks(error["message"])
    error_id = error["message"].split("error id ")[1].split(")")[0]
    assert any(error_id in line for line in handler.lines), handler.lines
    assert dead_status == 503 and dead_body["error"]["message"] == "the scheduler process died"


def test_a_draining_server_answers_503_to_every_new_request():
    state = ServerState(ServerArgs(), manager=None, ready=None, validation=None, tokenizer=None,
                        served_model_name="m", tokenizer_path="", metrics=None)
    state.draining = True

    async def run() -> list[tuple[int, dict]]:
        async with TestClient(TestServer(build_app(state))) as client:
            results = []
            for method, path in (("POST", "/v1/completions"), ("POST", "/generate"), ("GET", "/health"),
                                 ("GET", "/get_server_info")):
                response = await client.request(method, path, json={"prompt": "hi"})
                results.append((response.status, await response.json()))
            return results

    for status, body in asyncio.run(run()):
        assert status == 503 and "shutting down" in body["error"]["message"], body
