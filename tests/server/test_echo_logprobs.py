"""`/v1/completions` with `echo` and `logprobs` (as OpenAI and vLLM answer it): the text starts with the prompt and
`logprobs` covers the prompt's tokens too (the first one's logprob is null), each equal to transformers' float32
log-softmax of the same model, also when the radix cache already holds the prompt and prefill runs in chunks;
streamed the same; and the native `/generate` returns SGLang's `input_token_logprobs`."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from tests.runtime.tiny_models import make_tiny_model
from tests.server.server_process import ServerProcess
from toolkit.runtime.model_loader.embedded import embedded_model_path

TOP = 3
NEW_TOKENS = 5
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("echo-logprobs")
    return folder, make_tiny_model("llama-gqa-fullvocab", folder, seed=3)


@pytest.fixture(scope="module")
def server(tiny):
    folder, _ = tiny
    # NOTE: small chunks, so a prompt is prefilled in several; the radix cache is on (the default)
    process = ServerProcess("--model-path", str(folder), "--tokenizer-path", str(embedded_model_path()),
                            "--device", "cpu", "--dtype", "float32", "--max-total-tokens", "4096",
                            "--chunked-prefill-size", "16").wait_healthy()
    yield process
    process.stop()


def _prompts(count: int, seed: int) -> list[list[int]]:
    """Prompts of 20 to 60 tokens sharing a 20-token prefix; no special token (echo skips those)."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, 49152, (20,), generator=generator).tolist()
    return [prefix + torch.randint(100, 49152, (int(torch.randint(1, 40, (1,), generator=generator)),),
                                   generator=generator).tolist() for _ in range(count)]


def _reference(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def _complete(server, prompt, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True, "echo": True,
            "logprobs": TOP, **extra}
    response = requests.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _check(choice: dict, prompt: list[int], model, echoed: str) -> None:
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(echoed)
    assert len(logprobs["tokens"]) == len(prompt) + NEW_TOKENS
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    # the completion's tokens are the prompt's followed by the greedy ones: read them back from the top-k
    output = [max(top, key=top.get) for top in logprobs["top_logprobs"][len(prompt) :]]
    assert logprobs["tokens"][len(prompt) :] == output
    reference = _reference(model, prompt)
    expected = reference[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    got = torch.tensor(logprobs["token_logprobs"][1 : len(prompt)])
    torch.testing.assert_close(got, expected, rtol=0, atol=TOLERANCE)
    for top, row in zip(logprobs["top_logprobs"][1 : len(prompt)], reference[:-1]):
        values, _ = row.topk(TOP)
        torch.testing.assert_close(torch.tensor(sorted(top.values(), reverse=True)), values, rtol=0, atol=TOLERANCE)
    first_output = logprobs["token_logprobs"][len(prompt)]
    assert abs(first_output - reference[-1].max().item()) < TOLERANCE  # greedy: the top token's logprob
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets[len(prompt)] == len(echoed)
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], logprobs["tokens"]) if b != len(echoed))


def test_echo_logprobs_cover_the_prompt_and_equal_transformers_on_a_warm_cache(server, tiny):
    _, model = tiny
    prompts = _prompts(4, seed=31)
    for _ in range(2):  # NOTE: the second round finds every prompt (and the shared prefix) in the radix cache
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda p: _complete(server, p), prompts))
        for prompt, result in zip(prompts, results):
            (choice,) = result["choices"]
            echoed = requests.post(f"{server.url}/detokenize", json={"tokens": prompt}, timeout=30).json()["prompt"]
            _check(choice, prompt, model, echoed)


def test_echo_of_a_text_prompt_starts_the_text_and_its_tokens_spell_it(server):
    prompt = "The quick brown fox jumps over the lazy dog"
    (choice,) = _complete(server, prompt)["choices"]
    ids = requests.post(f"{server.url}/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    assert choice["text"].startswith(prompt)
    assert "".join(choice["logprobs"]["tokens"][: len(ids)]) == prompt
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert all(lp is not None and lp <= 0 for lp in choice["logprobs"]["token_logprobs"][1:])


def test_echo_with_zero_max_tokens_scores_the_prompt(server, tiny):
    """The scoring idiom (lm-eval's loglikelihood): echo, logprobs, max_tokens 0: the prompt back, scored."""
    _, model = tiny
    prompt = _prompts(1, seed=34)[0]
    result = _complete(server, prompt, max_tokens=0, logprobs=0)
    (choice,) = result["choices"]
    echoed = requests.post(f"{server.url}/detokenize", json={"tokens": prompt}, timeout=30).json()["prompt"]
    assert choice["text"] == echoed and choice["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 0
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) and logprobs["token_logprobs"][0] is None
    expected = _reference(model, prompt)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"][1:]), expected, rtol=0, atol=TOLERANCE)


def test_streamed_echo_logprobs_equal_the_non_streamed(server):
    prompt = _prompts(1, seed=32)[0]
    plain = _complete(server, prompt)["choices"][0]
    response = requests.post(f"{server.url}/v1/completions", stream=True, timeout=120, json={
        "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True, "echo": True,
        "logprobs": TOP, "stream": True})
    lines = [line.decode("utf-8") for line in response.iter_lines()]  # NOTE: SSE is UTF-8
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in choices) == plain["text"]
    merged = {key: [v for c in choices if c["logprobs"] for v in c["logprobs"][key]] for key in plain["logprobs"]}
    assert merged["tokens"] == plain["logprobs"]["tokens"]
    assert merged["text_offset"] == plain["logprobs"]["text_offset"]
    assert merged["token_logprobs"][0] is None
    torch.testing.assert_close(torch.tensor(merged["token_logprobs"][1:]),
                               torch.tensor(plain["logprobs"]["token_logprobs"][1:]), rtol=0, atol=TOLERANCE)


def test_native_generate_returns_input_token_logprobs_from_the_start_asked(server, tiny):
    _, model = tiny
    prompt = _prompts(1, seed=33)[0]
    response = requests.post(f"{server.url}/generate", timeout=120, json={
        "input_ids": prompt, "return_logprob": True, "logprob_start_len": 3,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert response.status_code == 200, response.text
    entries = response.json()["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in entries] == prompt[3:]
    expected = _reference(model, prompt)[2:-1].gather(1, torch.tensor(prompt[3:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([lp for lp, _, _ in entries]), expected, rtol=0, atol=TOLERANCE)
