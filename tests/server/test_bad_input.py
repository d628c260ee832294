"""Every malformed or out-of-range request gets 400/404/413 with an OpenAI-style body naming the field, and
the server keeps serving."""
from __future__ import annotations

import pytest
import requests

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

CASES = [
    # (endpoint, body (dict or raw bytes), status, param)
    (COMPLETIONS, b"{not json", 400, "body"),
    (COMPLETIONS, b"[1, 2, 3]", 400, "body"),
    (COMPLETIONS, {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {}, 400, "prompt"),
    (COMPLETIONS, {"prompt": 42}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, 2, 10_000_000]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi " * 9000}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "temperature": 3}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "top_k": 0}, 400, "top_k"),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "n": 1000}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "stop": 5}, 400, "stop"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 99}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    (COMPLETIONS, {"prompt": "hi", "presence_penalty": 5}, 400, "presence_penalty"),
    (COMPLETIONS, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    (CHAT, {"messages": USER, "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools"),
    (CHAT, {"messages": USER, "model": "llama"}, 404, "model"),
    ("/generate", {"text": "hi", "input_ids": [1]}, 400, "text"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}, 400, "sampling_params.temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_token": 5}}, 400, "sampling_params.max_new_token"),
    ("/generate", {"input_ids": []}, 400, "input_ids"),
    ("/generate", {"text": "hi", "sampling_params": [{}, {}]}, 400, "sampling_params"),
]


@pytest.mark.parametrize("endpoint, body, status, param", CASES, ids=[f"{c[0]}:{c[3]}:{i}" for i, c in enumerate(CASES)])
def test_bad_request_is_rejected_naming_the_field(server, endpoint, body, status, param):
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    response = requests.post(server.url + endpoint, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and error["message"]


def test_oversized_body_gets_413(server):
    response = requests.post(server.url + COMPLETIONS, data=b'{"prompt": "' + b"x" * (9 << 20) + b'"}', timeout=60)
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"


def test_unknown_route_gets_404_json(server):
    response = requests.get(server.url + "/v2/whatever", timeout=10)
    assert response.status_code == 404 and "no route" in response.json()["error"]["message"]


def test_server_still_answers_after_bad_input(server):
    for endpoint, body, _, _ in CASES[:5]:
        requests.post(server.url + endpoint, timeout=30, **({"data": body} if isinstance(body, bytes) else {"json": body}))
    response = requests.post(server.url + COMPLETIONS, json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
