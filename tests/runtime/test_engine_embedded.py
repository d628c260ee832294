"""The offline Engine on the embedded SmolLM2: greedy parity with transformers, sampling, stopping, logprobs (the
greedy parity with overlap scheduling on and off)."""
from __future__ import annotations

import pytest

from toolkit.runtime import Engine

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(dtype="float32", device="cpu", max_total_tokens=8192, max_running_requests=16, log_level="warning")


def test_engine_with_no_arguments_serves_the_embedded_model(engine):
    assert engine.runner.config.architecture == "LlamaForCausalLM"
    assert engine.runner.source.display_path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def overlap_engine() -> Engine:
    return Engine(dtype="float32", device="cpu", max_total_tokens=8192, max_running_requests=16, log_level="warning",
                  disable_overlap_schedule=False)


@pytest.mark.parametrize("mode", ["overlap", "no-overlap"])
def test_greedy_chat_batch_equals_transformers(mode, request, chat_prompt_ids, embedded_greedy):
    # NOTE: the default engine on a CPU runs without overlap; disable_overlap_schedule=False asks for it
    engine = request.getfixturevalue("overlap_engine" if mode == "overlap" else "engine")
    assert engine.scheduler.overlap == (mode == "overlap")
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    results = engine.generate(input_ids=chat_prompt_ids, sampling_params=params)
    for prompt, result in zip(chat_prompt_ids, results):
        assert result["output_ids"] == embedded_greedy(prompt, NEW_TOKENS)
        assert result["meta_info"]["completion_tokens"] == NEW_TOKENS
        assert result["meta_info"]["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
    assert engine.check_memory()


def test_eos_ends_a_chat_answer_with_finish_reason_stop(engine, chat_prompt_ids):
    result = engine.generate(input_ids=chat_prompt_ids[0], sampling_params={"max_new_tokens": 64, "temperature": 0})
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert result["output_ids"][-1] == 2 and "<|im_end|>" not in result["text"]
    assert "Paris" in result["text"]


def test_stop_string_is_excluded_and_reported(engine):
    result = engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 40, "temperature": 0, "stop": [" 7"]})
    assert result["text"] == " 4, 5, 6,"
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 7"}


def test_stop_string_spanning_token_boundaries(engine):
    free = engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 12, "temperature": 0})
    assert free["text"].startswith(" 4, 5, 6")
    stop = "5, 6"  # several tokens: '5', ',', ' ', '6'
    result = engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 12, "temperature": 0, "stop": stop})
    assert result["text"] == " 4, " and result["meta_info"]["finish_reason"]["matched"] == stop


def test_stop_token_ids_and_ignore_eos(engine):
    free = engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 8, "temperature": 0})
    stop_id = free["output_ids"][2]
    result = engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop_id]})
    assert result["output_ids"] == free["output_ids"][:3]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    long = engine.generate("Hi", {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True})
    assert long["meta_info"]["completion_tokens"] == 48


def test_seeded_sampling_is_reproducible_in_any_batch(engine):
    params = {"max_new_tokens": 16, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "min_p": 0.02, "seed": 1234}
    alone = engine.generate("Tell me a story about a dragon", params)["output_ids"]
    batch = engine.generate(["Write a poem", "Tell me a story about a dragon", "2+2="],
                            [{**params, "seed": 7}, params, {"max_new_tokens": 5}])
    assert batch[1]["output_ids"] == alone
    other_seed = engine.generate("Tell me a story about a dragon", {**params, "seed": 99})["output_ids"]
    assert other_seed != alone


def test_penalties_change_a_repetitive_greedy_output(engine):
    prompt = "Repeat after me: the the the the the"
    plain = engine.generate(prompt, {"max_new_tokens": 16, "temperature": 0})["output_ids"]
    penalized = engine.generate(prompt, {"max_new_tokens": 16, "temperature": 0, "repetition_penalty": 1.8,
                                         "frequency_penalty": 1.0, "presence_penalty": 1.0})["output_ids"]
    assert penalized != plain
    assert max(penalized.count(t) for t in set(penalized)) <= max(plain.count(t) for t in set(plain))


def test_logprobs_are_returned_for_each_output_token(engine):
    result = engine.generate("The sky is", {"max_new_tokens": 5, "temperature": 0}, return_logprob=True,
                             top_logprobs_num=3)
    logprobs = result["meta_info"]["output_token_logprobs"]
    assert [token for _, token in logprobs] == result["output_ids"]
    tops = result["meta_info"]["output_top_logprobs"]
    assert all(len(top) == 3 and top[0][0] == token for top, (_, token) in zip(tops, logprobs))
    assert all(lp <= 0 and abs(lp - top[0][1]) < 1e-5 for (lp, _), top in zip(logprobs, tops))


def test_n_returns_several_samples_per_prompt(engine):
    results = engine.generate("Name a color:", {"max_new_tokens": 4, "temperature": 1.0, "n": 3})
    assert len(results) == 3 and all(r["meta_info"]["completion_tokens"] >= 1 for r in results)


@pytest.mark.parametrize("bad, field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": -2}, "max_new_tokens"), ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"), ({"bogus": 1}, "bogus"), ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_name_the_field(engine, bad, field):
    from toolkit.runtime.sampling.sampling_params import SamplingParamsError

    with pytest.raises(SamplingParamsError) as error:
        engine.generate("x", bad)
    assert error.value.param == field and field in str(error.value)
