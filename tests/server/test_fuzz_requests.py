"""Property: whatever a client sends to a generation endpoint — valid, out of range, mistyped, hostile — the answer
is never a 5xx, a stream always ends with [DONE], the scheduler stays alive and the KV pool drains afterwards."""
from __future__ import annotations

import json
import time

import pytest
import requests
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.server.server_process import alive

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

MODEL = "SmolLM2-135M-Instruct"
EXAMPLES = 100  # per endpoint; each example is a request or two against the real server

SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
HUGE_INTS = st.sampled_from([-1, 0, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400])
SPECIAL_FLOATS = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -1e308, 5e-324])
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | SURROGATES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def hostile(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A valid value six times in seven, else an edge or garbage one; so about half the requests are valid
    throughout (and generate) and the rest are refused for one field or several."""
    edge = st.one_of(HUGE_INTS, SPECIAL_FLOATS, JUNK, SURROGATES, st.just(""), st.just([]))
    return st.sampled_from(range(7)).flatmap(lambda roll: edge if roll == 6 else valid)


TEXT = st.text(min_size=1, max_size=20)
TOKEN_IDS = st.lists(st.integers(0, 49151), min_size=1, max_size=6)
SAMPLING = {
    "temperature": hostile(st.floats(0, 2)),
    "top_p": hostile(st.floats(0.01, 1)),
    "top_k": hostile(st.sampled_from([-1, 1, 5, 50])),
    "min_p": hostile(st.floats(0, 1)),
    "frequency_penalty": hostile(st.floats(-2, 2)),
    "presence_penalty": hostile(st.floats(-2, 2)),
    "repetition_penalty": hostile(st.floats(0.5, 2)),
    "seed": hostile(st.integers(-(2**63), 2**63 - 1)),
    "stop": hostile(st.one_of(TEXT, st.lists(TEXT, max_size=4))),
    "stop_token_ids": hostile(st.lists(hostile(st.integers(0, 49151)), max_size=4)),
    "ignore_eos": hostile(st.booleans()),
}
MAX_TOKENS = hostile(st.integers(0, 4))  # always given, so that valid requests stay a few tokens long
OPENAI = {
    **SAMPLING,
    "n": hostile(st.integers(1, 2)),
    "stream": hostile(st.booleans()),
    "stream_options": hostile(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "model": hostile(st.just(MODEL)),
}
COMPLETION = st.fixed_dictionaries(
    {"prompt": hostile(st.one_of(TEXT, st.lists(hostile(TEXT), min_size=1, max_size=3), TOKEN_IDS,
                                 st.lists(TOKEN_IDS, min_size=1, max_size=2))),
     "max_tokens": MAX_TOKENS},
    optional={**OPENAI, "logprobs": hostile(st.integers(0, 5)), "echo": JUNK, "suffix": JUNK},
)
MESSAGE = st.fixed_dictionaries({"role": hostile(st.sampled_from(["system", "user", "assistant"])),
                                 "content": hostile(st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                                     {"type": st.just("text"), "text": hostile(TEXT)}), min_size=1, max_size=2)))})
CHAT = st.fixed_dictionaries(
    {"messages": hostile(st.lists(MESSAGE, min_size=1, max_size=3)), "max_tokens": MAX_TOKENS},
    optional={**OPENAI, "logprobs": hostile(st.booleans()), "top_logprobs": hostile(st.integers(0, 5)),
              "max_completion_tokens": hostile(st.integers(0, 4)), "response_format": JUNK, "tools": JUNK},
)
NATIVE_SAMPLING = st.fixed_dictionaries({"max_new_tokens": MAX_TOKENS},
                                        optional={**SAMPLING, "n": hostile(st.integers(1, 2)), "bogus": JUNK})
GENERATE = st.one_of(
    st.fixed_dictionaries({"text": hostile(st.one_of(TEXT, st.lists(hostile(TEXT), min_size=1, max_size=3))),
                           "sampling_params": hostile(NATIVE_SAMPLING)},
                          optional={"stream": hostile(st.booleans()),
                                    "return_logprob": hostile(st.booleans()),
                                    "top_logprobs_num": hostile(st.integers(0, 3))}),
    st.fixed_dictionaries({"input_ids": hostile(st.one_of(TOKEN_IDS, st.lists(TOKEN_IDS, min_size=1, max_size=2))),
                           "sampling_params": hostile(NATIVE_SAMPLING)},
                          optional={"stream": hostile(st.booleans())}),
    JUNK,
)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _send(server, path: str, body) -> None:
    data = json.dumps(body).encode()  # NaN/Infinity as JavaScript literals, surrogates as \ud800 escapes
    with requests.post(server.url + path, data=data, timeout=120, stream=True) as response:
        event(f"HTTP {response.status_code}")
        assert response.status_code < 500, (body, response.status_code, response.text[:500])
        if response.status_code != 200:
            assert response.json()["error"]["message"]
        elif response.headers["Content-Type"].startswith("text/event-stream"):
            events = [line for line in response.iter_lines() if line.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]", (body, events[-3:])
            assert not any(b'"error"' in event for event in events), (body, events[-3:])
        else:
            response.json()
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200, body


@FUZZ
@given(body=COMPLETION)
def test_completions_never_fail_the_server(server, body):
    _send(server, "/v1/completions", body)


@FUZZ
@given(body=CHAT)
def test_chat_completions_never_fail_the_server(server, body):
    _send(server, "/v1/chat/completions", body)


@FUZZ
@given(body=GENERATE)
def test_generate_never_fails_the_server(server, body):
    _send(server, "/generate", body)


def test_after_the_fuzzing_the_scheduler_lives_and_the_pool_is_empty(server):
    assert alive(server.scheduler_pid())
    deadline = time.monotonic() + 30
    while True:
        state = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_states"][0]
        if (state["num_running_reqs"], state["num_queue_reqs"], state["num_used_tokens"]) == (0, 0, 0):
            break
        assert time.monotonic() < deadline, f"the KV pool did not drain: {state}"
        time.sleep(0.1)
    assert state["memory_leak_detected"] is False
