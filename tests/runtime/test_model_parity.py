"""Logits of our model on the paged KV cache equal transformers' for tiny random Llama/Qwen2/Qwen3 models."""
from __future__ import annotations

import pytest
import torch

from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.driver import KVDriver
from tests.runtime.tiny_models import TINY_CONFIGS, make_tiny_model

TOLERANCE = 1e-4  # float32 on CPU; observed max errors are ~2e-6


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, make_tiny_model(request.param, folder)


def _runner(folder, page_size: int) -> ModelRunner:
    args = ServerArgs(model_path=str(folder), dtype="float32", device="cpu", page_size=page_size,
                      max_total_tokens=4096, max_running_requests=16)
    return ModelRunner(args)


def _reference_last_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def _report(name: str, what: str, err: float) -> None:
    print(f"{name} {what}: max abs logit error {err:.2e}")
    assert err < TOLERANCE, f"{name} {what}: max abs error {err:.2e} >= {TOLERANCE}"


@pytest.mark.parametrize("page_size", [1, 16])
def test_single_prefill_matches_transformers(tiny, page_size):
    name, folder, reference = tiny
    driver = KVDriver(_runner(folder, page_size))
    (prompt,) = _prompts(320, [37], seed=1)
    logits = driver.extend([driver.new_sequence()], [prompt])[0]
    _report(name, f"prefill ps={page_size}", (logits - _reference_last_logits(reference, prompt)).abs().max().item())


@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_length_batch_matches_transformers(tiny, page_size):
    name, folder, reference = tiny
    driver = KVDriver(_runner(folder, page_size))
    prompts = _prompts(320, [5, 33, 1, 17, 64], seed=2)
    logits = driver.extend([driver.new_sequence() for _ in prompts], prompts)
    err = max((logits[i] - _reference_last_logits(reference, p)).abs().max().item() for i, p in enumerate(prompts))
    _report(name, f"batch ps={page_size}", err)


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_on_cached_prefix_matches_transformers(tiny, page_size):
    name, folder, reference = tiny
    driver = KVDriver(_runner(folder, page_size))
    shared, tail_a, tail_b = _prompts(320, [32, 9, 20], seed=3)
    first = driver.new_sequence()
    driver.extend([first], [shared + tail_a])
    # a second request reuses the first 32 cached tokens (two full pages at page_size 16) and extends them
    second = driver.new_sequence(prefix_of=first, prefix_len=32)
    third = driver.new_sequence()
    logits = driver.extend([second, third], [tail_b, tail_a])
    err = max(
        (logits[0] - _reference_last_logits(reference, shared + tail_b)).abs().max().item(),
        (logits[1] - _reference_last_logits(reference, tail_a)).abs().max().item(),
    )
    _report(name, f"extend-on-prefix ps={page_size}", err)


@pytest.mark.parametrize("page_size", [1, 16])
def test_eight_decode_steps_match_transformers(tiny, page_size):
    name, folder, reference = tiny
    driver = KVDriver(_runner(folder, page_size))
    prompts = _prompts(320, [3, 15, 16, 40], seed=4)
    seqs = [driver.new_sequence() for _ in prompts]
    next_tokens = driver.extend(seqs, prompts).argmax(-1).tolist()
    err = 0.0
    for _ in range(8):
        logits = driver.decode(seqs, next_tokens)
        for i, seq in enumerate(seqs):
            err = max(err, (logits[i] - _reference_last_logits(reference, seq.tokens)).abs().max().item())
        next_tokens = logits.argmax(-1).tolist()
    _report(name, f"8 decode steps ps={page_size}", err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bfloat16_prefill_and_decode_match_transformers(tiny):
    name, folder, reference = tiny
    args = ServerArgs(model_path=str(folder), dtype="bfloat16", device="cuda", max_total_tokens=4096,
                      max_running_requests=16, attention_backend="triton")
    driver = KVDriver(ModelRunner(args))
    prompts = _prompts(320, [7, 29], seed=5)
    seqs = [driver.new_sequence() for _ in prompts]
    logits = driver.extend(seqs, prompts)
    logits = driver.decode(seqs, logits.argmax(-1).tolist())
    err = max((logits[i].cpu() - _reference_last_logits(reference, s.tokens)).abs().max().item()
              for i, s in enumerate(seqs))
    print(f"{name} cuda bf16: max abs logit error {err:.2e}")
    assert err < 5e-2
