"""Sampling math with exact numbers: top-k/top-p/min-p filters, penalties, greedy, seeds."""
from __future__ import annotations

import torch

import pytest

from toolkit.runtime.sampling.sampler import (
    Sampler,
    SamplingBatch,
    TokenHistory,
    apply_penalties,
    filter_probs,
    greedy_argmax,
)
from toolkit.runtime.sampling.sampling_params import SamplingParams

PROBS = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])


def _filtered(**kwargs) -> list[float]:
    return [round(x, 4) for x in filter_probs(PROBS.clone(), [SamplingParams(**kwargs)])[0].tolist()]


def test_top_k_keeps_the_k_most_likely():
    assert _filtered(top_k=2) == [0.0, 0.4, 0.0, 0.3, 0.0]


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    assert _filtered(top_p=0.7) == [0.0, 0.4, 0.0, 0.3, 0.0]  # 0.4 + 0.3 reaches 0.7
    assert _filtered(top_p=0.71) == [0.0, 0.4, 0.0, 0.3, 0.15]


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    assert _filtered(min_p=0.3) == [0.0, 0.4, 0.0, 0.3, 0.15]  # threshold 0.12


def test_penalties_follow_openai_and_sglang_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    params = [SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)]
    out = apply_penalties(logits, [(0, params[0], TokenHistory(prompt_ids=[2], output_ids=[0, 0, 1]))])
    # token 0: 2 - 0.5*2 - 0.25 = 0.75, seen → 0.375; token 1: -1 - 0.5 - 0.25 = -1.75, seen → -3.5;
    # token 2: in the prompt only → 0.5 / 2 = 0.25; token 3: untouched
    assert out.tolist() == [[0.375, -3.5, 0.25, 3.0]]


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.1, 9.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1)]
    out = Sampler("cpu").sample(logits, params, ["a", "b"], [TokenHistory([], [])] * 2)
    assert out.token_ids == [1, 2]


def test_a_seed_fixes_the_sample_sequence():
    logits = torch.zeros(1, 50)
    params = [SamplingParams(temperature=1.0, seed=5)]
    first = [Sampler("cpu").sample(logits, params, ["x"], [TokenHistory([], [])]).token_ids[0] for _ in range(3)]
    sampler = Sampler("cpu")
    stream = [sampler.sample(logits, params, ["x"], [TokenHistory([], [])]).token_ids[0] for _ in range(3)]
    assert len(set(first)) == 1 and stream[0] == first[0] and len(set(stream)) > 1


@pytest.mark.parametrize("vocab", [49152, 32000, 151936, 2500, 7])
def test_blocked_greedy_argmax_is_argmax_with_ties_to_the_first(vocab):
    logits = torch.randn(37, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[3, 5] = logits[3].max() + 1
    logits[3, vocab - 1] = logits[3, 5]  # a tie: the first index wins
    logits[4, vocab - 1] = logits[4].max() + 2  # the maximum in the last (short) block
    logits[5, :] = 0.0  # all equal: index 0
    assert torch.equal(greedy_argmax(logits), logits.argmax(dim=-1))


def test_only_the_rows_that_ask_get_logprobs_and_they_are_the_models_log_softmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.3, top_k=5, seed=4)]
    batch = SamplingBatch.build(params, ["a", "b", "c", "d"], "cpu", logprob_rows=[1, 2], top_logprobs_num=3)
    out = Sampler("cpu").sample_batch(logits, batch)
    expected = torch.log_softmax(logits, dim=-1)  # before temperature and filters
    picked = expected[[1, 2], out.token_ids[[1, 2]]]
    torch.testing.assert_close(out.logprobs, picked)
    torch.testing.assert_close(out.top_values, expected[[1, 2]].topk(3, dim=-1).values)
    assert out.token_ids[0] == logits[0].argmax() and out.token_ids[2] == logits[2].argmax()
    assert out.token_ids[3] in logits[3].topk(5).indices


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_sample_as_their_float32_widening(dtype):
    """The model hands over its own dtype: greedy rows take the argmax as is, penalized, sampled and logprob rows
    compute in float32, so every row equals what the widened float32 logits give."""
    logits = (torch.randn(6, 3000, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    logits[0, 17] = logits[0, 2900] = logits[0].max() + 1  # a tie: the first maximum wins either way
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, frequency_penalty=0.7),
              SamplingParams(temperature=0.8, seed=11), SamplingParams(temperature=1.3, top_k=40, seed=12),
              SamplingParams(temperature=0.0, repetition_penalty=1.5),
              SamplingParams(temperature=0.9, top_p=0.8, seed=13, presence_penalty=0.4)]
    histories = [TokenHistory(prompt_ids=[5, 6, 7], output_ids=[int(logits[i].float().argmax()), 9, 9])
                 for i in range(len(params))]
    rids = [f"r{i}" for i in range(len(params))]
    ours = Sampler("cpu").sample(logits, params, rids, histories, top_logprobs_num=3, return_logprob=True)
    wide = Sampler("cpu").sample(logits.float(), params, rids, histories, top_logprobs_num=3, return_logprob=True)
    assert ours.token_ids == wide.token_ids and ours.token_ids[0] == 17
    assert ours == wide
