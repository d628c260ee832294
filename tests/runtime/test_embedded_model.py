"""The embedded SmolLM2 GGUF: our greedy continuation equals transformers' from the same file."""
from __future__ import annotations

import pytest

from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.driver import KVDriver

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(ServerArgs(dtype="float32", device="cpu", max_total_tokens=8192, max_running_requests=8))


def test_embedded_model_config_is_smollm2(runner):
    config = runner.config
    assert (config.architecture, config.num_hidden_layers, config.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings) == (9, 3, True)


def test_greedy_chat_continuations_equal_transformers(runner, chat_prompt_ids, embedded_greedy):
    driver = KVDriver(runner)
    prompts = chat_prompt_ids[:3]
    seqs = [driver.new_sequence() for _ in prompts]
    outputs = [[token] for token in driver.extend(seqs, prompts).argmax(-1).tolist()]
    for _ in range(NEW_TOKENS - 1):
        next_tokens = driver.decode(seqs, [out[-1] for out in outputs]).argmax(-1).tolist()
        for out, token in zip(outputs, next_tokens):
            out.append(token)
    for prompt, ours in zip(prompts, outputs):
        assert ours == embedded_greedy(prompt, NEW_TOKENS)
