"""Greedy output of the engine equals transformers token for token, whatever the batching does:
16 concurrent requests, chunked prefill, page sizes, radix cache on/off, every policy, mixed chunks, retraction,
with overlap scheduling on and off."""
from __future__ import annotations

import pytest

from tests.conftest import reference_greedy
from tests.runtime.engine_fixtures import FORCED_RETRACTION, LogCapture, random_prompts, retraction_lines, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

NUM_REQUESTS = 16


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama-engine")
    return folder, make_tiny_model("llama-gqa-llama3rope", folder, seed=7)


def _workload(tiny_model, max_new: list[int]):
    folder, model = tiny_model
    prompts = random_prompts(NUM_REQUESTS, vocab=320, seed=11)
    return folder, prompts, max_new, [reference_greedy(model, p, n) for p, n in zip(prompts, max_new)]


@pytest.fixture(scope="module")
def workload(tiny_model):
    return _workload(tiny_model, [6 + (i * 5) % 19 for i in range(NUM_REQUESTS)])


@pytest.fixture(scope="module")
def long_output_workload(tiny_model):
    """Outputs long enough that running requests outgrow a small pool admitted optimistically."""
    return _workload(tiny_model, [40] * NUM_REQUESTS)


def _params(max_new: list[int]) -> list[dict]:
    return [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in max_new]


def _run(workload, overlap: bool, **engine_args):
    folder, prompts, max_new, expected = workload
    engine = tiny_engine(folder, disable_overlap_schedule=not overlap, **engine_args)
    with LogCapture() as log:
        results = engine.generate(input_ids=prompts, sampling_params=_params(max_new))
    assert [r["output_ids"] for r in results] == expected
    assert engine.check_memory(), "KV memory leaked"
    return engine, results, log.lines


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chunked_prefill_size", [16, 64, -1])
def test_greedy_equal_across_chunk_and_page_sizes(workload, chunked_prefill_size, page_size, overlap):
    _, _, lines = _run(workload, overlap, chunked_prefill_size=chunked_prefill_size, page_size=page_size)
    if chunked_prefill_size == 16:
        assert any("#new-token: 16," in line for line in lines), "no prefill chunk of 16 tokens was logged"


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight", "lof", "random"])
def test_greedy_equal_under_every_policy(workload, policy, overlap):
    _run(workload, overlap, schedule_policy=policy, chunked_prefill_size=64)


def test_greedy_equal_with_radix_cache_off(workload, overlap):
    _run(workload, overlap, disable_radix_cache=True)


def test_greedy_equal_with_mixed_chunk(workload, overlap):
    _run(workload, overlap, enable_mixed_chunk=True, chunked_prefill_size=32, max_prefill_tokens=64)


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_cache_hits_are_counted_and_output_unchanged(workload, page_size, overlap):
    engine, first, _ = _run(workload, overlap, page_size=page_size)
    folder, prompts, max_new, expected = workload
    second = engine.generate(input_ids=prompts, sampling_params=_params(max_new))
    assert [r["output_ids"] for r in second] == expected
    for prompt, result in zip(prompts, second):
        cached = result["meta_info"]["cached_tokens"]
        assert cached == (len(prompt) - 1) // page_size * page_size
    assert engine.check_memory()


@pytest.mark.parametrize("page_size", [1, 16])
def test_forced_retraction_keeps_greedy_output_identical(long_output_workload, page_size, overlap):
    _, _, lines = _run(long_output_workload, overlap, page_size=page_size, **FORCED_RETRACTION)
    assert retraction_lines(lines), "the tiny pool never forced a retraction"


def test_lone_request_that_cannot_fit_is_aborted_with_a_reason(workload):
    folder, prompts, _, _ = workload
    engine = tiny_engine(folder, max_total_tokens=64, context_length=512)
    result = engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 100, "ignore_eos": True})
    reason = result["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "KV pool holds 64" in reason["message"]
    ok = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert ok["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert engine.check_memory()


def test_token_ids_outside_the_vocabulary_are_rejected(workload):
    folder, _, _, _ = workload
    engine = tiny_engine(folder)
    with pytest.raises(ValueError, match=r"token id 320 is outside the model's vocabulary \[0, 320\)"):
        engine.generate(input_ids=[5, 320], sampling_params={"max_new_tokens": 1})
    from toolkit.runtime.sampling.sampling_params import SamplingParams
    from toolkit.runtime.io_struct import GenerateInput

    engine.scheduler.add_request(GenerateInput("bad", [1, 99999], SamplingParams(max_new_tokens=2)))
    (output,) = engine.scheduler.step()
    assert output.finished_reason.kind == "abort" and "vocabulary" in output.finished_reason.message
    assert engine.check_memory()


def test_prompt_longer_than_the_context_is_rejected(workload):
    folder, _, _, _ = workload
    engine = tiny_engine(folder, context_length=32)
    with pytest.raises(ValueError, match=r"longer than the model's context length \(32 tokens\)"):
        engine.generate(input_ids=list(range(3, 40)), sampling_params={"max_new_tokens": 1})
    with pytest.raises(ValueError, match="exceeds the model's maximum context length of 32"):
        engine.generate(input_ids=list(range(3, 20)), sampling_params={"max_new_tokens": 20})
    with pytest.raises(ValueError, match="You requested a total of 32 tokens"):
        engine.generate(input_ids=list(range(3, 20)), sampling_params={"max_new_tokens": 15})
    # the refusals left nothing behind: the longest request that fits (17 + 14 = 31 < 32) runs to its length
    ok = engine.generate(input_ids=list(range(3, 20)), sampling_params={"max_new_tokens": 14, "ignore_eos": True})
    assert ok["meta_info"]["finish_reason"] == {"type": "length", "length": 14}
    assert engine.check_memory()
