"""Constrained decoding through the offline Engine on a tiny random model with the embedded tokenizer's vocabulary
(float32, CPU): a constrained greedy request yields exactly what transformers' greedy loop yields under the same
xgrammar masks, alone or batched with free requests (whose outputs it leaves untouched), and stays identical with
chunked prefill, overlap scheduling, the radix cache, forced retraction and TP 2."""
from __future__ import annotations

import json

import pytest
import torch
import xgrammar

from tests.conftest import reference_greedy
from tests.runtime.engine_fixtures import FORCED_RETRACTION, LogCapture, random_prompts, retraction_lines, tiny_engine
from tests.runtime.tiny_models import make_tiny_model
from toolkit.runtime.model_loader.tokenizer import load_tokenizer

EOS = 2
VOCAB = 49152
NEW_TOKENS = 12
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"]}
REGEX = r"[a-c]{2,5}-[0-9]{1,3}"
EBNF = 'root ::= ("yes" | "no") " " [0-9]'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("constrained")
    return folder, make_tiny_model("llama-gqa-fullvocab", folder, seed=3)


@pytest.fixture(scope="module")
def compiler():
    info = xgrammar.TokenizerInfo.from_huggingface(load_tokenizer(None), vocab_size=VOCAB, stop_token_ids=[EOS])
    return xgrammar.GrammarCompiler(info)


def _compiled(compiler, kind: str, text: str):
    if kind == "json_schema":
        return compiler.compile_json_schema(text)
    return compiler.compile_regex(text) if kind == "regex" else compiler.compile_grammar(text)


def reference_constrained(model, compiled, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' logits, float32, masked by xgrammar's matcher, argmax; ends when the grammar does."""
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, VOCAB)
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[:, -1, :].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgrammar.apply_token_bitmask_inplace(logits, bitmask)
            token = int(logits.argmax(-1))
            assert matcher.accept_token(token)
            out.append(token)
            ids.append(token)
            if matcher.is_terminated():
                break
    return out


def _requests(prompts: list[list[int]]) -> list[dict]:
    """Per prompt: a JSON schema, a regex, an EBNF grammar or nothing, in turn."""
    kinds = [("json_schema", json.dumps(SCHEMA)), ("regex", REGEX), ("ebnf", EBNF), (None, None)]
    params = []
    for i, _ in enumerate(prompts):
        kind, text = kinds[i % len(kinds)]
        p = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0}
        params.append({**p, kind: text} if kind else {**p, "ignore_eos": True})
    return params


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(8, vocab=VOCAB, seed=5)


@pytest.fixture(scope="module")
def expected(tiny, compiler, prompts):
    _, model = tiny
    out = []
    for prompt, params in zip(prompts, _requests(prompts)):
        kind = next((k for k in ("json_schema", "regex", "ebnf") if k in params), None)
        if kind is None:
            out.append(reference_greedy(model, prompt, NEW_TOKENS))
        else:
            out.append(reference_constrained(model, _compiled(compiler, kind, params[kind]), prompt, NEW_TOKENS))
    return out


def _run(folder, prompts, one_by_one: bool = False, **settings) -> list[list[int]]:
    engine = tiny_engine(folder, **settings)
    try:
        params = _requests(prompts)
        if one_by_one:
            return [engine.generate(input_ids=p, sampling_params=s)["output_ids"] for p, s in zip(prompts, params)]
        return [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]
    finally:
        engine.shutdown()


def test_constrained_greedy_equals_transformers_under_the_same_masks_alone_and_batched(tiny, prompts, expected):
    folder, _ = tiny
    assert _run(folder, prompts, one_by_one=True) == expected
    assert _run(folder, prompts) == expected


@pytest.mark.parametrize("settings", [
    {"chunked_prefill_size": 16, "enable_mixed_chunk": True},
    {"disable_overlap_schedule": False},
    {"disable_overlap_schedule": False, "chunked_prefill_size": 8, "page_size": 4},
    {"disable_radix_cache": True},
], ids=["chunked-mixed", "overlap", "overlap-chunked-paged", "no-radix"])
def test_constrained_output_is_identical_across_scheduling_features(tiny, prompts, expected, settings):
    folder, _ = tiny
    assert _run(folder, prompts, **settings) == expected


def test_radix_cache_hit_keeps_constrained_output(tiny, prompts, expected):
    """The same requests twice on one engine: the second run's prompts come from the prefix cache."""
    folder, _ = tiny
    engine = tiny_engine(folder)
    try:
        params = _requests(prompts)
        first = engine.generate(input_ids=prompts, sampling_params=params)
        second = engine.generate(input_ids=prompts, sampling_params=params)
    finally:
        engine.shutdown()
    assert [r["output_ids"] for r in first] == expected == [r["output_ids"] for r in second]
    assert sum(r["meta_info"]["cached_tokens"] for r in second) > 0


def test_forced_retraction_resumes_each_matcher_where_it_was(tiny):
    """16 prompts decoding 40 tokens in a 480-token pool: retracted requests are prefilled again with their output
    so far, and their matchers (kept) go on from there: outputs equal the single-request runs."""
    folder, _ = tiny
    prompts = random_prompts(16, vocab=VOCAB, seed=9)
    params = [{"max_new_tokens": 40, "temperature": 0.0, "regex": "[a-z ]{300,600}"} if i % 2 else
              {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True} for i in range(len(prompts))]
    engine = tiny_engine(folder, log_level="info", **FORCED_RETRACTION)
    try:
        alone = [engine.generate(input_ids=p, sampling_params=s)["output_ids"] for p, s in zip(prompts, params)]
        with LogCapture() as log:
            batched = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]
        assert engine.check_memory()
    finally:
        engine.shutdown()
    assert retraction_lines(log.lines), "the pool was meant to force retractions"
    assert batched == alone
    for i in range(1, len(prompts), 2):
        assert len(batched[i]) == 40


def test_tensor_parallel_2_gives_the_same_constrained_tokens(tiny, prompts, expected):
    folder, _ = tiny
    assert _run(folder, prompts, tp_size=2) == expected


def test_invalid_grammar_aborts_only_its_request(tiny, prompts):
    folder, _ = tiny
    engine = tiny_engine(folder)
    try:
        out = engine.generate(input_ids=prompts[:2], sampling_params=[
            {"max_new_tokens": 4, "regex": "(unclosed"}, {"max_new_tokens": 4, "temperature": 0.0}])
    finally:
        engine.shutdown()
    assert out[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "invalid regex" in out[0]["meta_info"]["finish_reason"]["message"]
    assert len(out[1]["output_ids"]) == 4


def test_grammar_backend_none_refuses_constrained_requests(tiny, prompts):
    folder, _ = tiny
    engine = tiny_engine(folder, grammar_backend="none")
    try:
        out = engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 4, "regex": "a+"})
    finally:
        engine.shutdown()
    assert "--grammar-backend none" in out["meta_info"]["finish_reason"]["message"]
