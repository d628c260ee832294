"""A tiny model run through the triton backend (interpreted on CPU) gives torch_native's logits and greedy tokens:
prefill, extend on a shared prefix mixed with one-token extends, and decode steps."""
from __future__ import annotations

import pytest
import torch

from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.driver import KVDriver
from tests.runtime.tiny_models import make_tiny_model

TOLERANCE = 1e-4  # float32 logits; observed max abs differences ~1e-6
DECODE_STEPS = 4


def _runner(folder, backend: str, page_size: int) -> ModelRunner:
    args = ServerArgs(model_path=str(folder), dtype="float32", device="cpu", page_size=page_size,
                      max_total_tokens=2048, max_running_requests=8, attention_backend=backend)
    return ModelRunner(args)


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 320, (n,), generator=generator).tolist() for n in lengths]


def _greedy_script(driver: KVDriver) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Logits of every step and each sequence's tokens, choosing next tokens greedily from this run's logits."""
    prompts = _prompts([5, 40, 17], seed=7)
    seqs = [driver.new_sequence() for _ in prompts]
    steps = [driver.extend(seqs, prompts)]
    next_tokens = steps[-1].argmax(-1).tolist()
    # a new request reusing 32 cached tokens (page-aligned) of the second, beside two one-token extends that
    # continue partial pages, as in a mixed chunk
    (tail,) = _prompts([9], seed=8)
    shared = driver.new_sequence(prefix_of=seqs[1], prefix_len=32)
    steps.append(driver.extend([shared, seqs[0], seqs[2]], [tail, [next_tokens[0]], [next_tokens[2]]]))
    seqs = [shared, seqs[0], seqs[2], seqs[1]]
    next_tokens = steps[-1].argmax(-1).tolist() + [next_tokens[1]]
    for _ in range(DECODE_STEPS):
        steps.append(driver.decode(seqs, next_tokens))
        next_tokens = steps[-1].argmax(-1).tolist()
    return steps, [s.tokens for s in seqs]


@pytest.mark.parametrize("name, page_size", [("qwen3-qknorm", 16), ("llama-gqa-llama3rope", 1)])
def test_triton_backend_greedy_matches_torch_native(name, page_size, tmp_path):
    make_tiny_model(name, tmp_path)
    reference_steps, reference_tokens = _greedy_script(KVDriver(_runner(tmp_path, "torch_native", page_size)))
    steps, tokens = _greedy_script(KVDriver(_runner(tmp_path, "triton", page_size)))
    errors = [(mine - theirs).abs().max().item() for mine, theirs in zip(steps, reference_steps)]
    print(f"{name} ps={page_size}: max abs logit error per step {['%.1e' % e for e in errors]}")
    assert max(errors) < TOLERANCE
    assert tokens == reference_tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_triton_logits_match_torch_native(tmp_path):
    make_tiny_model("qwen3-qknorm", tmp_path)
    logits = {}
    for backend in ("torch_native", "triton"):
        args = ServerArgs(model_path=str(tmp_path), dtype="bfloat16", device="cuda", page_size=16,
                          max_total_tokens=4096, max_running_requests=8, attention_backend=backend)
        driver = KVDriver(ModelRunner(args))
        prompts = _prompts([7, 300, 29], seed=9)
        seqs = [driver.new_sequence() for _ in prompts]
        steps = [driver.extend(seqs, prompts)]
        for token in (3, 5, 11):
            # NOTE: a replayed graph's logits live in its static buffer, overwritten by the next replay: copy them
            steps.append(driver.decode(seqs, [token] * len(seqs)).clone())
        logits[backend] = steps
    err = max((a - b).abs().max().item() for a, b in zip(logits["triton"], logits["torch_native"]))
    print(f"cuda bf16 triton vs torch_native: max abs logit error {err:.2e}")
    assert err < 5e-2
