"""Logprob values, not just their consistency: the engine's reported logprobs and top-k equal transformers' float32
log-softmax of the same model at the same positions, within 1e-3. They are the model's distribution after
penalties and before temperature and top-k/top-p filtering (SGLang's and vLLM's default)."""
from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from tests.runtime.engine_fixtures import random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

TOP = 5
NEW_TOKENS = 10
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-logprobs")
    return folder, make_tiny_model("qwen2-bias", folder, seed=4)


def _reference(model, prompt: list[int], output: list[int], penalize=None) -> torch.Tensor:
    """transformers' float32 log-softmax at each generated position (teacher-forced on the engine's tokens),
    after `penalize(logits_row, tokens_so_far, generated_so_far)` where given. [len(output), vocab]."""
    ids = torch.tensor([prompt + output[:-1]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 :].float()
    rows = []
    for i, row in enumerate(logits):
        if penalize is not None:
            row = penalize(row, prompt + output[:i], output[:i])
        rows.append(torch.log_softmax(row, dim=-1))
    return torch.stack(rows)


def _check(result: dict, reference: torch.Tensor) -> None:
    meta = result["meta_info"]
    chosen = torch.tensor([lp for lp, _ in meta["output_token_logprobs"]])
    ids = torch.tensor(result["output_ids"])
    assert [t for _, t in meta["output_token_logprobs"]] == result["output_ids"]
    torch.testing.assert_close(chosen, reference.gather(1, ids[:, None])[:, 0], rtol=0, atol=TOLERANCE)
    for top, row in zip(meta["output_top_logprobs"], reference):
        values, indices = row.topk(TOP)
        assert [t for t, _ in top] == indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in top]), values, rtol=0, atol=TOLERANCE)


def _generate(engine, prompts, params) -> list[dict]:
    return engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": NEW_TOKENS, "ignore_eos": True,
                                                               **params},
                           return_logprob=True, top_logprobs_num=TOP)


def test_greedy_logprobs_and_top_k_equal_transformers(tiny, overlap):
    folder, model = tiny
    prompts = random_prompts(4, vocab=320, seed=8)
    engine = tiny_engine(folder, disable_overlap_schedule=not overlap)
    for prompt, result in zip(prompts, _generate(engine, prompts, {"temperature": 0.0})):
        reference = _reference(model, prompt, result["output_ids"])
        assert result["output_ids"] == reference.argmax(-1).tolist()  # greedy: each token is the top-1
        _check(result, reference)


def test_sampled_logprobs_are_before_temperature_and_filters(tiny):
    folder, model = tiny
    prompts = random_prompts(3, vocab=320, seed=9)
    params = {"temperature": 1.7, "top_k": 20, "top_p": 0.8, "seed": 3}
    off_greedy = 0
    for prompt, result in zip(prompts, _generate(tiny_engine(folder), prompts, params)):
        reference = _reference(model, prompt, result["output_ids"])
        _check(result, reference)
        assert all(t in row.topk(20).indices for t, row in zip(result["output_ids"], reference))
        off_greedy += sum(t != row.argmax().item() for t, row in zip(result["output_ids"], reference))
    assert off_greedy > 0, "nothing was sampled off the top-1: temperature would not have mattered"


@pytest.mark.parametrize("params", [
    {"repetition_penalty": 1.6},
    {"frequency_penalty": 0.8, "presence_penalty": 0.6},
], ids=["repetition", "frequency-presence"])
def test_logprobs_are_after_penalties(tiny, params):
    folder, model = tiny
    prompts = random_prompts(3, vocab=320, seed=10)
    repetition = RepetitionPenaltyLogitsProcessor(params.get("repetition_penalty", 1.0))

    def penalize(row: torch.Tensor, tokens: list[int], generated: list[int]) -> torch.Tensor:
        row = repetition(torch.tensor([tokens]), row[None].clone())[0]  # prompt and output tokens (HF's rule)
        counts = torch.bincount(torch.tensor(generated, dtype=torch.int64), minlength=row.numel()).float()
        return row - params.get("frequency_penalty", 0.0) * counts - params.get("presence_penalty", 0.0) * (counts > 0)

    results = _generate(tiny_engine(folder), prompts, {"temperature": 0.0, **params})
    moved = 0.0
    for prompt, result in zip(prompts, results):
        reference = _reference(model, prompt, result["output_ids"], penalize)
        assert result["output_ids"] == reference.argmax(-1).tolist()
        _check(result, reference)
        moved = max(moved, (reference - _reference(model, prompt, result["output_ids"])).abs().max().item())
    assert moved > 0.1, "the penalties changed nothing: before- and after-penalty logprobs would look alike"
