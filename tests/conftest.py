"""Shared fixtures: the embedded model's tokenizer and its transformers reference (both loaded once)."""
from __future__ import annotations

import os

# NOTE: on pytest-xdist's workers (`make test`) every process of the suite, the servers it starts included, runs
# one intra-op thread: two workers fill two cores, and a second OpenMP team beside another busy process spends its
# time in fork-join waits (measured: the run's CPU seconds 1.25x a serial run's). Set before torch is imported.
# Tests that judge speed (`solo`) get the machine's own count back (tests/solo.py); thread counts are tested
# explicitly (tests/runtime/attention/test_cpu_decode_kernel.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# the whole suite's budget, the machine to itself for tests that judge speed, the units of work of its workers
pytest_plugins = ["tests.suite_budget", "tests.solo", "tests.xdist_units"]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not torch.cuda.is_available():
    # NOTE: must be set before triton is imported; Triton kernels then run on CPU tensors in its interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child in two sentences.",
    "List three prime numbers.",
]


@pytest.fixture(scope="session")
def embedded_tokenizer():
    from toolkit.runtime.model_loader.tokenizer import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def chat_prompt_ids(embedded_tokenizer) -> list[list[int]]:
    ids = []
    for prompt in CHAT_PROMPTS:
        encoded = embedded_tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        ids.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    return ids


@pytest.fixture(scope="session")
def embedded_reference():
    """transformers' own model loaded from the embedded GGUF, float32: the ground truth."""
    from transformers import AutoModelForCausalLM

    from toolkit.runtime.model_loader.embedded import embedded_model_path

    path = embedded_model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers greedy continuation; the explicit mask keeps `generate` from masking pad-id tokens."""
    inputs = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=model.config.pad_token_id,
        )
    return out[0, len(prompt_ids):].tolist()
