"""A server that sheds load (503, or an in-stream error with code 503 / queue_full / waiting_timeout) is counted
apart: `shed`, not `failed`, with a verdict sentence saying so, in the record and the printed summary."""
from __future__ import annotations

import numpy as np

from tests.bench.stub import Script, StubServer
from tests.bench.test_cli import SMALL, bench, records
from toolkit.bench import eventloop
from toolkit.bench.benchmark import RunSettings, Target, measure
from toolkit.bench.datasets import Prompt
from toolkit.bench.metrics import summarize
from toolkit.bench.outcome import SHED
from toolkit.bench.verdict import shed_verdict
from toolkit.bench.workload import Workload

SLOW = Script(ttft=0.2, chunks=((0.0, 1), (0.01, 1)))


def _burst(texts: list[str]) -> Workload:
    return Workload([Prompt(t, 2, 2) for t in texts], np.zeros(len(texts)), float("inf"), "constant")


def test_a_burst_beyond_capacity_and_queue_counts_the_503s_as_shed_not_failed():
    async def run():
        async with StubServer(default=SLOW, capacity=2, max_queued=2) as stub:
            target = Target(stub.base_url, "openai", model="stub-model")
            measured = await measure(target, RunSettings(request_timeout=10, warmup_requests=0),
                                     _burst([f"p{i}" for i in range(10)]))
            return measured.run, stub.shed

    run, stub_shed = eventloop.run(run())
    summary = summarize(run.outcomes, run.duration)
    assert stub_shed == 6  # 2 served at once, 2 waiting, the rest refused
    assert (summary["completed"], summary["shed"], summary["failed"], summary["errors"]) == (4, 6, 0, {})
    shed = [o for o in run.outcomes if o.error == SHED]
    assert all("queue is full" in o.message for o in shed)
    assert all(o.ended - o.sent < 0.2 for o in shed)  # answered at once, not after the 0.2 s of a served request


def test_an_in_stream_queue_timeout_is_shed_and_other_stream_errors_still_fail():
    scripts = {"timed out": Script(error_event=True, error_code="waiting_timeout", chunks=((0.0, 1), (0.002, 1))),
               "scripted 503": Script(error_event=True, error_code=503, chunks=((0.0, 1), (0.002, 1))),
               "broken": Script(error_event=True, chunks=((0.0, 1), (0.002, 1)))}

    async def run():
        async with StubServer(scripts) as stub:
            target = Target(stub.base_url, "sglang")
            measured = await measure(target, RunSettings(request_timeout=10, warmup_requests=0),
                                     _burst([*scripts, "fine"]))
            return measured.run

    run = eventloop.run(run())
    summary = summarize(run.outcomes, run.duration)
    assert (summary["completed"], summary["shed"], summary["failed"]) == (1, 2, 1)
    assert summary["errors"] == {"server_error": 1}


def test_the_record_and_the_printed_summary_say_the_server_shed_load(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=SLOW, capacity=1, max_queued=1) as stub:
        result = bench("--base-url", stub.base_url, "--backend", "sglang-oai", *SMALL, "--num-prompts", "6",
                       "--rate", "inf", "--output-file", str(out))
    assert result.exit_code == 0, result.output
    [record] = records(out)
    assert (record["completed"], record["shed"], record["failed"]) == (2, 4, 0)
    assert record["shed_verdict"] == shed_verdict(4, 6)
    assert record["shed_verdict"].startswith("The server shed load: it refused 4 of 6 requests with 503")
    assert "Shed by the server (503)" in result.output and "The server shed load" in result.output


def test_no_verdict_without_shedding():
    assert shed_verdict(0, 10) is None
    assert "all 3 requests" in shed_verdict(3, 3)
