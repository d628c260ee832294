"""A request's lifecycle status follows the scheduler's transitions exactly: queued, prefilled (in chunks), decoding,
retracted and re-admitted, finished or aborted; and between steps every request is held where its status says."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from toolkit.runtime.io_struct import GenerateInput
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.scheduler.request import Req, ReqStatus
from tests.runtime.engine_fixtures import FORCED_RETRACTION, random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

W, P, R, X = ReqStatus.WAITING, ReqStatus.PREFILLING, ReqStatus.RUNNING, ReqStatus.RETRACTED
F, A = ReqStatus.FINISHED, ReqStatus.ABORTED
# every transition the scheduler may make (a request may finish with the token its prefill samples)
ALLOWED = {W: {P, A}, P: {R, F, A}, R: {X, F, A}, X: {P, A}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-status")
    make_tiny_model("llama-gqa-llama3rope", path, seed=7)
    return path


@pytest.fixture
def transitions(monkeypatch) -> dict[str, list[ReqStatus]]:
    """Every status each request takes, in order (a status set again is recorded once)."""
    seen: dict[str, list[ReqStatus]] = defaultdict(list)

    def record(req: Req, name: str, value: object) -> None:
        if name == "status" and (not seen[req.rid] or seen[req.rid][-1] is not value):
            seen[req.rid].append(value)
        object.__setattr__(req, name, value)

    monkeypatch.setattr(Req, "__setattr__", record)
    return seen


def _submit(scheduler, rid: str, prompt: list[int], max_new: int) -> Req:
    scheduler.add_request(GenerateInput(rid, prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True)))
    return scheduler.waiting[-1]


def test_statuses_follow_admit_chunk_decode_retract_readmit_finish_and_abort(folder, transitions, overlap):
    scheduler = tiny_engine(folder, disable_overlap_schedule=not overlap, **FORCED_RETRACTION).scheduler
    long_prompt = torch.randint(3, 320, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    reqs = [_submit(scheduler, "long", long_prompt, 40)]
    reqs += [_submit(scheduler, f"r{i}", p, 40) for i, p in enumerate(random_prompts(16, 320, seed=11))]
    gone = _submit(scheduler, "gone", [5, 6, 7], 4)
    scheduler.abort_request("gone")
    chunked_between_steps: set[str] = set()
    aborted_running = None
    for _ in range(3000):
        scheduler.step()
        scheduler.check_statuses()
        if scheduler.chunked_req is not None:
            chunked_between_steps.add(scheduler.chunked_req.rid)
            assert scheduler.chunked_req.status is P
        if aborted_running is None:
            decoding = [r for r in scheduler.running.reqs if r.status is R and len(r.output_ids) >= 5]
            if decoding:
                aborted_running = decoding[0]
                scheduler.abort_request(aborted_running.rid)
        if not scheduler.has_work:
            break
    assert not scheduler.has_work and scheduler.check_memory()

    assert "long" in chunked_between_steps, "the 150-token prompt was prefilled in 64-token chunks"
    assert transitions["gone"] == [W, A] and gone.status is A
    assert transitions[aborted_running.rid][-2:] == [R, A]
    for rid, path in transitions.items():
        assert path[0] is W and path[-1] in (F, A), (rid, path)
        assert all(b in ALLOWED[a] for a, b in zip(path, path[1:])), (rid, path)
    readmitted = [path for path in transitions.values() if path[-4:] == [X, P, R, F]]
    assert readmitted, "no request was retracted, re-admitted and then finished"
    assert all(r.status is F for r in reqs if r is not aborted_running)
