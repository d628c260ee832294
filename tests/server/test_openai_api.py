"""The official `openai` client against `toolkit serve`: completions and chat, streamed or not, n, stop,
logprobs, usage — and greedy text equal to the in-process Engine's."""
from __future__ import annotations

from collections import defaultdict

import openai
import pytest
import requests
import torch

from toolkit.runtime import Engine

PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(dtype="float32", device="cpu", max_total_tokens=4096, log_level="warning")


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]


def test_greedy_completion_equals_the_engine(client, engine):
    expected = engine.generate(PROMPT, {"max_new_tokens": 24, "temperature": 0})
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=24, temperature=0)
    assert result.choices[0].text == expected["text"]
    assert result.usage.prompt_tokens == expected["meta_info"]["prompt_tokens"]
    assert result.usage.completion_tokens == 24 and result.choices[0].finish_reason == "length"


def test_streamed_completion_equals_the_non_streamed_one(client):
    plain = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=20,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_greedy_equals_the_engine_with_the_chat_template(client, engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 40, "temperature": 0})
    result = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=40,
                                            temperature=0)
    assert result.choices[0].message.content == expected["text"]
    assert result.choices[0].finish_reason == "stop" and result.usage.prompt_tokens == len(ids)


def test_chat_stream_deltas_assemble_the_message(client):
    messages = [{"role": "user", "content": "Name two planets."}]
    plain = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=30,
                                           temperature=0)
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=30,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_n_samples_distinct_choices(client):
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt="A random word:", max_tokens=8,
                                       temperature=1.0, n=2, seed=3)
    assert [c.index for c in result.choices] == [0, 1]
    assert result.choices[0].text != result.choices[1].text
    again = client.completions.create(model="SmolLM2-135M-Instruct", prompt="A random word:", max_tokens=8,
                                      temperature=1.0, n=2, seed=3)
    assert [c.text for c in again.choices] == [c.text for c in result.choices]


def _by_index(chunks, text_of) -> tuple[dict[int, str], dict[int, list[str]]]:
    texts, finishes = defaultdict(str), defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += text_of(choice)
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    return dict(texts), dict(finishes)


def test_n_samples_stream_as_the_non_streamed_ones(client):
    """n > 1 with stream: every index's deltas assemble its non-streamed choice (seeded), each index finishes once,
    and the usage chunk counts all of them."""
    params = dict(model="SmolLM2-135M-Instruct", prompt="A random word:", max_tokens=10, temperature=1.0, n=3,
                  seed=5)
    plain = client.completions.create(**params)
    chunks = list(client.completions.create(**params, stream=True, stream_options={"include_usage": True}))
    texts, finishes = _by_index(chunks, lambda c: c.text)
    assert [texts[i] for i in sorted(texts)] == [c.text for c in plain.choices] and sorted(texts) == [0, 1, 2]
    assert len(set(texts.values())) > 1, "the three samples were identical"
    assert finishes == {c.index: [c.finish_reason] for c in plain.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens == 30


def test_chat_n_samples_stream_as_the_non_streamed_ones(client):
    params = dict(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Say a color."}],
                  max_tokens=12, temperature=1.0, n=2, seed=9)
    plain = client.chat.completions.create(**params)
    chunks = list(client.chat.completions.create(**params, stream=True))
    texts, finishes = _by_index(chunks, lambda c: c.delta.content or "")
    assert [texts[i] for i in sorted(texts)] == [c.message.content for c in plain.choices]
    assert finishes == {c.index: [c.finish_reason] for c in plain.choices}


def test_logprobs_equal_transformers_float32(server, client, embedded_reference, embedded_tokenizer):
    """The values, not just their shape: /generate's logprobs and top-3 equal transformers' float32 log-softmax of
    the same model within 1e-3, and /v1/completions reports the same numbers."""
    ids = list(embedded_tokenizer.encode(PROMPT))
    native = requests.post(f"{server.url}/generate", timeout=60, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "return_logprob": True,
        "top_logprobs_num": 3}).json()
    out, meta = native["output_ids"], native["meta_info"]
    with torch.no_grad():
        logits = embedded_reference(torch.tensor([ids + out[:-1]])).logits[0, len(ids) - 1 :].float()
    reference = torch.log_softmax(logits, dim=-1)
    assert out == reference.argmax(-1).tolist()
    chosen = torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]])
    torch.testing.assert_close(chosen, reference.gather(1, torch.tensor(out)[:, None])[:, 0], rtol=0, atol=1e-3)
    for top, row in zip(meta["output_top_logprobs"], reference):
        values, indices = row.topk(3)
        assert [t for _, t, _ in top] == indices.tolist()
        torch.testing.assert_close(torch.tensor([v for v, _, _ in top]), values, rtol=0, atol=1e-3)
    openai_lp = client.completions.create(model="SmolLM2-135M-Instruct", prompt=ids, max_tokens=6, temperature=0,
                                          logprobs=3).choices[0].logprobs
    assert openai_lp.token_logprobs == pytest.approx(chosen.tolist(), abs=1e-6)


def test_stop_string_ends_and_is_excluded(client):
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,", max_tokens=30,
                                       temperature=0, stop=[" 6"])
    assert result.choices[0].text == " 4, 5,"
    assert result.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,", max_tokens=30,
                                         temperature=0, stop=[" 6"], stream=True)
    assert "".join(c.choices[0].text for c in streamed) == " 4, 5,"


def test_completion_logprobs(client):
    result = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=5, temperature=0,
                                       logprobs=2)
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == 5 and "".join(logprobs.tokens) == result.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(lp, abs=1e-4)
               for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs))


def test_chat_logprobs(client):
    result = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=4, temperature=0,
                                            messages=[{"role": "user", "content": "Hi"}], logprobs=True,
                                            top_logprobs=3)
    content = result.choices[0].logprobs.content
    assert len(content) == 4 and all(len(item.top_logprobs) == 3 for item in content)


def test_cached_tokens_are_reported(client):
    long_prompt = "Here is a long shared system prompt about tuning servers. " * 8
    client.completions.create(model="SmolLM2-135M-Instruct", prompt=long_prompt + "A", max_tokens=2)
    second = client.completions.create(model="SmolLM2-135M-Instruct", prompt=long_prompt + "B", max_tokens=2)
    assert second.usage.prompt_tokens_details.cached_tokens >= 60
