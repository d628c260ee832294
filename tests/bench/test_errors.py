"""Failed requests are counted by kind and the run goes on; Ctrl-C keeps what was measured."""
from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from toolkit.bench import eventloop
from toolkit.bench.benchmark import RunSettings, Target, measure
from toolkit.bench.datasets import Prompt
from toolkit.bench.metrics import summarize
from toolkit.bench.outcome import CANCELLED
from toolkit.bench.workload import Workload
from tests.bench.stub import Script, StubServer
from toolkit.tune.launcher import free_port

FAILURES = {
    "five hundred": Script(status=500),
    "service unavailable": Script(status=503),
    "hangs forever": Script(hang=True),
    "malformed stream": Script(malformed=True, chunks=((0.0, 1), (0.002, 1), (0.002, 1))),
    "dropped mid stream": Script(drop=True, chunks=((0.0, 1), (0.002, 1), (0.002, 1), (0.002, 1))),
    "error event": Script(error_event=True, chunks=((0.0, 1), (0.002, 1), (0.002, 1))),
}


def _workload(texts: list[str], gap: float = 0.005) -> Workload:
    prompts = [Prompt(t, 2, 3) for t in texts]
    return Workload(prompts, np.arange(len(prompts)) * gap, 1 / gap, "constant")


@pytest.mark.parametrize("backend", ["sglang", "openai-chat"])
def test_failures_are_counted_by_kind_and_never_stop_the_run(backend):
    texts = [f"good {i}" for i in range(6)] + list(FAILURES)
    texts = texts[::2] + texts[1::2]

    async def run():
        async with StubServer(FAILURES) as stub:
            target = Target(stub.base_url, backend, model="stub-model")
            return await measure(target, RunSettings(request_timeout=0.5, warmup_requests=0), _workload(texts))

    run = eventloop.run(run()).run
    summary = summarize(run.outcomes, run.duration)
    # NOTE: the 503 is load shed by the server, counted apart from the failures (tests/bench/test_shed.py)
    assert summary["completed"] == 6 and summary["failed"] == 5 and summary["shed"] == 1
    assert summary["errors"] == {"http_500": 1, "timeout": 1, "malformed_response": 1, "connection": 1,
                                 "server_error": 1}
    by_text = {texts[o.index]: o for o in run.outcomes}
    assert "scripted 500" in by_text["five hundred"].message
    assert "scripted failure" in by_text["error event"].message
    # the 0.5 s timeout (give or take the event loop's own clock and timer granularity), long before the stub's
    # 30 s hang would end
    assert 0.45 <= by_text["hangs forever"].ended - by_text["hangs forever"].sent < 10
    assert all(by_text[f"good {i}"].output_len == 2 for i in range(6))


def test_refused_connections_are_connection_errors():
    port = free_port()

    async def run():
        target = Target(f"http://127.0.0.1:{port}", "openai", model="m")
        return await measure(target, RunSettings(request_timeout=2, warmup_requests=1), _workload(["a", "b", "c"]))

    measured = eventloop.run(run())
    summary = summarize(measured.run.outcomes, measured.run.duration)
    assert measured.warmup_failures == 1
    assert summary["errors"] == {"connection": 3} and summary["completed"] == 0
    assert all("Connect" in o.message or "refused" in o.message for o in measured.run.outcomes)


def test_ctrl_c_cancels_in_flight_requests_and_keeps_the_finished_ones():
    fast, slow = Script(ttft=0.005), Script(ttft=60.0)
    texts = [f"fast {i}" for i in range(3)] + [f"slow {i}" for i in range(3)] + [f"late {i}" for i in range(3)]
    scripts = {t: fast if t.startswith("fast") else slow for t in texts}
    workload = Workload([Prompt(t, 2, 2) for t in texts], np.array([0, 0, 0, 0.05, 0.05, 0.05, 120, 120, 120.0]),
                        1.0, "constant")

    async def ctrl_c_once_the_slow_ones_are_in_flight(stub: StubServer) -> None:
        for _ in range(500):  # at most 5 s
            if len(stub.served) == 6 and stub.in_flight == 3:
                break
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    async def run():
        async with StubServer(scripts) as stub:
            interrupt = asyncio.ensure_future(ctrl_c_once_the_slow_ones_are_in_flight(stub))
            target = Target(stub.base_url, "sglang")
            measured = await measure(target, RunSettings(request_timeout=30, warmup_requests=0), workload)
            await interrupt
            return measured

    run = eventloop.run(run()).run
    assert run.interrupted and run.duration < 30  # the slow ones answer after 60 s, the late ones start at 120 s
    summary = summarize(run.outcomes, run.duration)
    assert (summary["num_requests"], summary["completed"], summary["cancelled"], summary["failed"]) == (6, 3, 3, 0)
    assert [o.error for o in run.outcomes[3:6]] == [CANCELLED] * 3
    assert all(o.dispatched == 0 for o in run.outcomes[6:])
