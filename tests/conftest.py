"""Shared fixtures: the embedded model's tokenizer, and its transformers reference and greedy continuations (read from
the GGUF, and computed, once a run)."""
from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

# NOTE: on pytest-xdist's workers (`make test`) every process of the suite, the servers it starts included, runs
# one intra-op thread: two workers fill two cores, and a second OpenMP team beside another busy process spends its
# time in fork-join waits (measured: the run's CPU seconds 1.25x a serial run's). Set before torch is imported.
# Tests that judge speed (`solo`) get the machine's own count back (tests/solo.py); thread counts are tested
# explicitly (tests/runtime/attention/test_cpu_decode_kernel.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# NOTE: oneDNN reads its ISA cap once, when the process starts; a test that sets it later runs uncapped here
_ONEDNN_CAP_AT_START = os.environ.get("ONEDNN_MAX_CPU_ISA", "none")

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


SHARED_FOLDER_ENV = "TOOLKIT_TEST_SHARED_FOLDER"


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this test run shares: pytest-xdist's workers (their base temps sit in the run's),
    and a pytest a test starts with SHARED_FOLDER_ENV set to it."""
    if os.environ.get(SHARED_FOLDER_ENV):
        return Path(os.environ[SHARED_FOLDER_ENV])
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load_embedded_reference(folder: Path):
    """transformers' own model loaded from the embedded GGUF, float32: the ground truth. transformers' GGUF reader
    takes ~20 s (it parses the whole vocabulary, twice); the first process of the run saves what it loaded to
    `folder` (safetensors, bit for bit) and the others load that."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM

    from toolkit.runtime.model_loader.embedded import embedded_model_path

    with _locked(folder):
        if (folder / "config.json").is_file():
            return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        path = embedded_model_path()
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32).eval()
        # NOTE: transformers refuses to save a model it read from a GGUF; the weights and config saved by hand
        # are what it loaded (safetensors' save_model keeps the tied embedding once)
        safetensors.torch.save_model(model, str(folder / "model.safetensors"))
        config = copy.deepcopy(model.config)
        del config.quantization_config  # the saved weights are the dequantized float32 ones
        config.save_pretrained(str(folder))
        return model


@pytest.fixture(scope="session")
def embedded_reference(tmp_path_factory):
    return load_embedded_reference(shared_folder(tmp_path_factory) / "embedded-reference")


class EmbeddedGreedy:
    """The embedded model's transformers greedy continuations, computed once a run: a folder every process of the
    run shares holds each prompt's continuation of at least MIN_TOKENS (greedy without an end token is
    deterministic, so a shorter one is its prefix), and the model loads only on a miss. A flock keeps a second
    worker from computing what the first is computing. The oneDNN ISA cap this process started with is part of the
    key: a capped run computes its own."""

    MIN_TOKENS = 32

    def __init__(self, folder: Path, model_folder: Path) -> None:
        self._folder, self._model_folder = folder, model_folder
        self._model = None

    def __call__(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        path = self._folder / f"{self._key(prompt_ids)}.json"
        with _locked(self._folder):
            stored = json.loads(path.read_text()) if path.is_file() else []
            if len(stored) < max_new_tokens:
                if self._model is None:
                    self._model = load_embedded_reference(self._model_folder)
                stored = reference_greedy(self._model, prompt_ids, max(max_new_tokens, self.MIN_TOKENS))
                path.write_text(json.dumps(stored))
        return stored[:max_new_tokens]

    @staticmethod
    def _key(prompt_ids: list[int]) -> str:
        return hashlib.sha256(f"{_ONEDNN_CAP_AT_START}:{prompt_ids}".encode()).hexdigest()[:24]


@pytest.fixture(scope="session")
def embedded_greedy(tmp_path_factory) -> EmbeddedGreedy:
    """`embedded_greedy(prompt_ids, n)`: the reference's first n greedy tokens (see EmbeddedGreedy)."""
    folder = shared_folder(tmp_path_factory)
    return EmbeddedGreedy(folder / "embedded-greedy", folder / "embedded-reference")


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers greedy continuation; the explicit mask keeps `generate` from masking pad-id tokens."""
    inputs = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=model.config.pad_token_id,
        )
    return out[0, len(prompt_ids):].tolist()
