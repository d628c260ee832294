"""Every malformed, out-of-range or hostile request gets 400/404/413 with an OpenAI-style body naming the field,
and the server keeps serving: the scheduler stays alive, the event loop answers, the KV pool drains."""
from __future__ import annotations

import socket
import struct
import time

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
    (COMPLETIONS, {"prompt": "hi", "echo": "yes"}, 400, "echo"),
    (COMPLETIONS, {"prompt": "hi", "echo": True, "logprobs": 21}, 400, "logprobs"),
    ("/generate", {"text": "hi", "logprob_start_len": 0}, 400, "logprob_start_len"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"1": 101}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    (CHAT, {"messages": USER, "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools[0]"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
    (CHAT, {"messages": USER, "model": "llama"}, 404, "model"),
    ("/generate", {"text": "hi", "input_ids": [1]}, 400, "text"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}, 400, "sampling_params.temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_token": 5}}, 400, "sampling_params.max_new_token"),
    ("/generate", {"input_ids": []}, 400, "input_ids"),
    ("/generate", {"text": "hi", "sampling_params": [{}, {}]}, 400, "sampling_params"),
]

# What once killed or froze the server (issue #13): values outside 64 bits reach torch, n loops in the event
# loop, numbers and nesting beyond what json/float accept, lone surrogates reach the tokenizer.
SAMPLE = {"max_new_tokens": 3, "temperature": 1.0}
HOSTILE_CASES = [
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "seed": 18446744073709551616}, 400, "seed"),
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "seed": -(2**63) - 1}, 400, "seed"),
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "temperature": 1, "top_k": 2**63}, 400, "top_k"),
    (CHAT, {"messages": USER, "max_tokens": 3, "temperature": 1, "top_k": 2**63}, 400, "top_k"),
    (CHAT, {"messages": USER, "max_tokens": 3, "seed": 10**30}, 400, "seed"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "seed": 10**30}}, 400, "sampling_params.seed"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "top_k": 2**63}}, 400, "sampling_params.top_k"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1, "n": 1_000_000_000}}, 400,
     "sampling_params.n"),
    ("/generate", {"input_ids": [[5]] * 2000, "sampling_params": {"max_new_tokens": 1}}, 400, "input_ids"),
    (COMPLETIONS, {"prompt": [[5]] * 2000, "max_tokens": 1}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ["a"] * 20, "max_tokens": 1, "n": 100}, 400, "n"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "stop": [f"s{i}" for i in range(1000)]}}, 400,
     "sampling_params.stop"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "stop": ["x" * 5000]}}, 400, "sampling_params.stop"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "stop_token_ids": list(range(5000))}}, 400,
     "sampling_params.stop_token_ids"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": Infinity}}', 400,
     "sampling_params.temperature"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "temperature": 1e308}}, 400,
     "sampling_params.temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 100_000}}, 400,
     "sampling_params.max_new_tokens"),
    (COMPLETIONS, b'{"prompt": "Hi", "max_tokens": ' + b"9" * 5000 + b"}", 400, "body"),
    (COMPLETIONS, b"[" * 100_000 + b"]" * 100_000, 400, "body"),
    (COMPLETIONS, b'{"prompt": "Hi", "x": ' + b"[" * 200 + b"]" * 200 + b"}", 400, "body"),
    (COMPLETIONS, b'{"prompt": "\\ud800", "max_tokens": 3}', 400, "prompt"),
    (COMPLETIONS, b'{"prompt": "Hi", "max_tokens": 3, "stop": "\\udfff"}', 400, "stop"),
    ("/generate", b'{"text": "\\ud800", "sampling_params": {"max_new_tokens": 3}}', 400, "text"),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "messages[0].content"),
    (COMPLETIONS, b'{"prompt": "Hi", "max_tokens": 3, "temperature": ' + b"9" * 401 + b"}", 400, "temperature"),
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "top_p": 10**400}, 400, "top_p"),
    (COMPLETIONS, b'{"prompt": "Hi", "max_tokens": 3, "temperature": NaN}', 400, "temperature"),
    ("/generate", {"text": "hi", "sampling_params": {**SAMPLE, "frequency_penalty": -(10**300)}}, 400,
     "sampling_params.frequency_penalty"),
]
ALL_CASES = CASES + HOSTILE_CASES


def _post(server, endpoint: str, body) -> requests.Response:
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    return requests.post(server.url + endpoint, timeout=30, **kwargs)


def _idle_state(server) -> dict:
    deadline = time.monotonic() + 30
    while True:
        state = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_states"][0]
        if (state["num_running_reqs"], state["num_queue_reqs"], state["num_used_tokens"]) == (0, 0, 0):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"the KV pool did not drain: {state}")
        time.sleep(0.1)


@pytest.mark.parametrize("endpoint, body, status, param", ALL_CASES,
                         ids=[f"{c[0]}:{c[3]}:{i}" for i, c in enumerate(ALL_CASES)])
def test_bad_request_is_rejected_naming_the_field(server, endpoint, body, status, param):
    response = _post(server, endpoint, body)
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and 0 < len(error["message"]) < 1000


def test_oversized_body_gets_413(server):
    response = requests.post(server.url + COMPLETIONS, data=b'{"prompt": "' + b"x" * (9 << 20) + b'"}', timeout=60)
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"


def test_unknown_route_gets_404_json(server):
    response = requests.get(server.url + "/v2/whatever", timeout=10)
    assert response.status_code == 404 and "no route" in response.json()["error"]["message"]


def test_server_still_answers_after_the_whole_table(server):
    statuses = [_post(server, endpoint, body).status_code for endpoint, body, _, _ in ALL_CASES]
    assert all(400 <= status < 500 for status in statuses), statuses
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    response = requests.post(server.url + COMPLETIONS, json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert _idle_state(server)["memory_leak_detected"] is False


def _send_and_reset(port: int, body: bytes, partial: bool) -> None:
    """Send a request (or half of it) and close with a TCP reset, before any response can be written."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + (body[: len(body) // 2] if partial else body))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_clients_that_reset_before_the_headers_are_not_server_errors(server):
    before = server.log_file.read_text()
    for i in range(60):
        stream = "true" if i % 2 == 0 else "false"
        body = b'{"prompt": "Hello there", "max_tokens": 8, "stream": %s}' % stream.encode()
        _send_and_reset(server.port, body, partial=i % 5 == 4)
    _idle_state(server)
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    new = server.log_file.read_text()[len(before):]
    assert " 500 " not in new and "Traceback" not in new, new[-3000:]
