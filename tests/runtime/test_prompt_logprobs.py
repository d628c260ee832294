"""The prompt's own logprobs (SGLang's `logprob_start_len`, the OpenAI `echo` + `logprobs`): each prompt token's
logprob and top-k equal transformers' float32 log-softmax at the position before it, with the radix cache holding
the prompt's prefix already, with chunked prefill, and with either overlap mode; asking for them changes no output."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.engine_fixtures import random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

TOP = 4
TOLERANCE = 1e-3
PARAMS = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-prompt-logprobs")
    return folder, make_tiny_model("llama-gqa-llama3rope", folder, seed=5)


def _reference(model, ids: list[int]) -> torch.Tensor:
    """Log-softmax at every position of `ids` (row q scores token q + 1). [len(ids), vocab]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def _check_prompt(result: dict, prompt: list[int], reference: torch.Tensor, start: int) -> None:
    meta = result["meta_info"]
    entries = meta["input_token_logprobs"]
    assert [t for _, t in entries] == prompt[start:]
    if start == 0:
        assert entries[0][0] is None and meta["input_top_logprobs"][0] is None
        entries, tops = entries[1:], meta["input_top_logprobs"][1:]
    else:
        tops = meta["input_top_logprobs"]
    first = max(start, 1)
    rows = reference[first - 1 : len(prompt) - 1]
    expected = rows.gather(1, torch.tensor(prompt[first:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([lp for lp, _ in entries]), expected, rtol=0, atol=TOLERANCE)
    for top, row in zip(tops, rows):
        values, indices = row.topk(TOP)
        assert [t for t, _ in top] == indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in top]), values, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("chunk", [16, -1], ids=["chunked", "whole"])
def test_prompt_logprobs_equal_transformers_over_a_warm_radix_cache(tiny, overlap, chunk):
    folder, model = tiny
    prompts = random_prompts(6, vocab=320, seed=11)
    engine = tiny_engine(folder, disable_overlap_schedule=not overlap, chunked_prefill_size=chunk)
    try:
        plain = engine.generate(input_ids=prompts, sampling_params=PARAMS)  # NOTE: now every prompt is cached
        for start in (0, 5):
            results = engine.generate(input_ids=prompts, sampling_params=PARAMS, return_logprob=True,
                                      top_logprobs_num=TOP, logprob_start_len=start)
            for prompt, result, before in zip(prompts, results, plain):
                assert result["output_ids"] == before["output_ids"]
                reference = _reference(model, prompt + result["output_ids"])
                _check_prompt(result, prompt, reference, start)
                first_output = result["meta_info"]["output_token_logprobs"][0][0]
                assert abs(first_output - reference[len(prompt) - 1, result["output_ids"][0]].item()) < TOLERANCE
        assert engine.check_memory()
    finally:
        engine.shutdown()



def test_zero_new_tokens_scores_the_prompt_only(tiny, overlap):
    """max_new_tokens 0 (the scoring idiom: echo, logprobs, max_tokens 0): the prompt's logprobs, no token."""
    folder, model = tiny
    prompts = random_prompts(3, vocab=320, seed=13)
    engine = tiny_engine(folder, disable_overlap_schedule=not overlap, chunked_prefill_size=16)
    try:
        results = engine.generate(input_ids=prompts, sampling_params={**PARAMS, "max_new_tokens": 0},
                                  return_logprob=True, top_logprobs_num=TOP, logprob_start_len=0)
        for prompt, result in zip(prompts, results):
            assert result["output_ids"] == [] and result["meta_info"]["finish_reason"]["type"] == "length"
            _check_prompt(result, prompt, _reference(model, prompt), 0)
        assert engine.check_memory()
    finally:
        engine.shutdown()
