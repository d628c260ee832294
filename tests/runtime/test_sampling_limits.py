"""Sampling values at the edges of the documented limits: refused by the shared validation with the field named,
and harmless to the sampler if one ever slips through (defence in depth)."""
from __future__ import annotations

import pytest
import torch

from toolkit.runtime.sampling.sampler import Sampler, filter_probs
from toolkit.runtime.sampling.sampling_params import SamplingParams, SamplingParamsError
from toolkit.runtime.server import limits


@pytest.mark.parametrize("field, value", [
    ("seed", limits.SEED_MAX + 1), ("seed", limits.SEED_MIN - 1), ("seed", 10**30),
    ("top_k", limits.TOP_K_MAX + 1), ("top_k", 2**63),
    ("temperature", limits.TEMPERATURE_MAX * 1.5), ("temperature", float("inf")), ("temperature", 10**400),
    ("n", limits.MAX_N + 1), ("n", 10**9),
    ("stop", [f"s{i}" for i in range(limits.MAX_STOP_STRINGS + 1)]), ("stop", ["x" * (limits.MAX_STOP_CHARS + 1)]),
    ("stop", ["\ud800"]), ("stop_token_ids", list(range(limits.MAX_STOP_TOKEN_IDS + 1))),
    ("top_p", 10**400), ("frequency_penalty", -(10**400)), ("max_new_tokens", -1),
])
def test_values_beyond_the_limits_are_refused_naming_the_field(field, value):
    with pytest.raises(SamplingParamsError) as error:
        SamplingParams.from_dict({field: value})
    assert error.value.param == field
    assert len(str(error.value)) < 300


@pytest.mark.parametrize("field, value", [
    ("seed", limits.SEED_MAX), ("seed", limits.SEED_MIN), ("top_k", limits.TOP_K_MAX),
    ("temperature", limits.TEMPERATURE_MAX), ("n", limits.MAX_N), ("stop", ["x"] * limits.MAX_STOP_STRINGS),
])
def test_values_at_the_limits_are_accepted(field, value):
    assert getattr(SamplingParams.from_dict({field: value}), field) == value


@pytest.mark.parametrize("seed", [2**64, 10**30, -(2**63) - 5])
def test_the_sampler_takes_any_seed_modulo_64_bits(seed):
    sampler = Sampler("cpu")
    probs = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    params = [SamplingParams(temperature=1.0, seed=seed)]
    first = sampler.sample(torch.log(probs), params, ["a"], [None]).token_ids
    wrapped = Sampler("cpu").sample(torch.log(probs), [SamplingParams(temperature=1.0, seed=seed % 2**64)], ["a"],
                                    [None]).token_ids
    assert first == wrapped


def test_the_sampler_treats_a_huge_top_k_as_the_whole_vocabulary():
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    assert filter_probs(probs.clone(), [SamplingParams(top_k=2**63)]).tolist() == probs.tolist()
    both = filter_probs(probs.repeat(2, 1), [SamplingParams(top_k=2**63), SamplingParams(top_k=2)])
    assert torch.equal(both, torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15], [0.0, 0.4, 0.0, 0.3, 0.0]]))
