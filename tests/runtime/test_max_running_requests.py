"""--max-running-requests caps the running batch: with more requests waiting than the cap, the batch fills up to
the cap and never past it, the log lines say so, and every request still finishes."""
from __future__ import annotations

import re

import pytest

from toolkit.runtime.io_struct import GenerateInput
from toolkit.runtime.memory.planning import default_max_running_requests
from toolkit.runtime.sampling.sampling_params import SamplingParams
from tests.runtime.engine_fixtures import LogCapture, random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

CAP = 3
DECODE_RE = re.compile(r"Decode batch\. #running-req: (\d+), .* #queue-req: (\d+), #grammar-queue-req: \d+$")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-cap")
    make_tiny_model("llama-tied-linearrope", path, seed=2)
    return path


def test_running_batch_never_exceeds_the_cap_while_requests_queue(folder, overlap):
    engine = tiny_engine(folder, max_running_requests=CAP, decode_log_interval=1,
                         disable_overlap_schedule=not overlap)
    scheduler = engine.scheduler
    assert scheduler.max_running_requests == CAP
    prompts = random_prompts(10, vocab=320, seed=6)
    for i, prompt in enumerate(prompts):
        scheduler.add_request(GenerateInput(f"r{i}", prompt, SamplingParams(max_new_tokens=6 + i, ignore_eos=True)))
    running, queued, finished = [], [], set()
    with LogCapture() as log:
        for _ in range(2000):
            finished |= {o.rid for o in scheduler.step() if o.finished_reason is not None}
            running.append(len(scheduler.running))
            queued.append(len(scheduler.waiting))
            if not scheduler.has_work:
                break
    assert finished == {f"r{i}" for i in range(10)}
    assert max(running) == CAP, f"the batch peaked at {max(running)} requests"
    assert any(r == CAP and q > 0 for r, q in zip(running, queued)), "the cap was never the limit"
    lines = [m for m in map(DECODE_RE.search, log.lines) if m]
    assert lines and max(int(m.group(1)) for m in lines) == CAP
    assert any(int(m.group(1)) == CAP and int(m.group(2)) > 0 for m in lines)
    assert engine.check_memory()


def test_without_the_flag_the_cap_is_the_planning_rule(folder):
    engine = tiny_engine(folder, max_running_requests=None, max_total_tokens=16384)
    runner = engine.runner
    expected = default_max_running_requests(runner.max_total_num_tokens, runner.context_len)
    assert engine.scheduler.max_running_requests == expected
    assert expected < runner.req_to_token_pool.size  # NOTE: the request table has a row for every running request
