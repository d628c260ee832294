"""Constrained decoding, logit_bias, echo, /tokenize and /detokenize end to end over HTTP on the embedded model
(float32, CPU): outputs parse and validate against their schema, regex or grammar on every endpoint, streamed too;
a bad grammar is a 400 naming its field (before any stream starts), a grammar compiling past the bound is a 400
after it, a grammar that cannot end within max_tokens finishes with `length`; constrained and free requests in one
batch give what they give alone; the grammar queue shows in the decode line and /metrics."""
from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import requests

from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a person called Ana, aged 31, as JSON."}]
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
EBNF = 'root ::= "The answer is " ("yes" | "no") "."'
COMPILE_BOUND_S = 1.5  # NOTE: above what the other grammars here take on a loaded 2-core machine
SLOW_SCHEMA = {"type": "object", "properties": {"p": {"type": "string", "pattern": "[a-z]{1,6000}"}}}  # ~4 s


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    log_file = tmp_path_factory.mktemp("constrained") / "server.log"
    process = ServerProcess("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "20000",
                            "--enable-metrics", "--decode-log-interval", "2",
                            "--grammar-compile-timeout", str(COMPILE_BOUND_S), log_file=log_file).wait_healthy()
    yield process
    process.stop()


def _post(server, path: str, body: dict, timeout: float = 300) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=timeout)


def _ok(server, path: str, body: dict) -> dict:
    response = _post(server, path, body)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def _generate(server, text: str, **sampling) -> dict:
    return _ok(server, "/generate", {"text": text, "sampling_params": {"temperature": 0, **sampling}})


def test_response_format_json_schema_output_validates(api):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    body = _ok(api, CHAT, {"messages": ASK, "response_format": fmt, "max_tokens": 64, "temperature": 0})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_response_format_json_object_is_an_object(api):
    city = [{"role": "user", "content": 'Give the capital of France as a JSON object with the key "city".'}]
    body = _ok(api, CHAT, {"messages": city, "response_format": {"type": "json_object"}, "max_tokens": 120,
                           "temperature": 0})
    assert body["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)


def test_streamed_json_schema_output_validates(api):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    response = requests.post(api.url + CHAT, json={"messages": ASK, "response_format": fmt, "max_tokens": 64,
                                                   "temperature": 0, "stream": True}, stream=True, timeout=300)
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.iter_lines(decode_unicode=True)
              if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    jsonschema.validate(json.loads(text), PERSON)


def test_sglang_regex_and_ebnf_outputs_match(api):
    phone = _generate(api, "My phone number is ", regex=PHONE, max_new_tokens=24)
    assert re.fullmatch(PHONE, phone["text"]), phone["text"]
    answer = _generate(api, "Is the sky blue?", ebnf=EBNF, max_new_tokens=16)
    assert answer["text"] in ("The answer is yes.", "The answer is no.")
    completion = _ok(api, COMPLETIONS, {"prompt": "Call me at ", "regex": PHONE, "max_tokens": 24, "temperature": 0})
    assert re.fullmatch(PHONE, completion["choices"][0]["text"])
    schema = _generate(api, "A person as JSON: ", json_schema=json.dumps(PERSON), max_new_tokens=64)
    jsonschema.validate(json.loads(schema["text"]), PERSON)


@pytest.mark.parametrize("path, body, param", [
    ("/generate", {"text": "hi", "sampling_params": {"json_schema": "{not json"}}, "sampling_params.json_schema"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "(unclosed"}}, "sampling_params.regex"),
    ("/generate", {"text": "hi", "sampling_params": {"ebnf": "root ::= ???"}}, "sampling_params.ebnf"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}}, "sampling_params.ebnf"),
    (CHAT, {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "strin"}}}}, "response_format.json_schema"),
    (CHAT, {"messages": ASK, "response_format": {"type": "xml"}}, "response_format"),
    (CHAT, {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": "person"}},
     "response_format.json_schema"),
    (CHAT, {"messages": ASK, "regex": "(a"}, "regex"),
    (COMPLETIONS, {"prompt": "hi", "ebnf": "root ::="}, "ebnf"),
    (CHAT, {"messages": ASK, "regex": "(a", "stream": True}, "regex"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "(" * 30000 + "a" + ")" * 30000}},
     "sampling_params.regex"),
])
def test_invalid_grammar_is_a_400_naming_its_field(api, path, body, param):
    response = _post(api, path, body, timeout=60)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error


def test_server_serves_after_invalid_grammars(api):
    assert requests.get(api.url + "/health_generate", timeout=60).status_code == 200


def test_grammar_compiling_past_the_bound_is_a_400_after_it_and_remembered(api):
    body = {"text": "x", "sampling_params": {"json_schema": json.dumps(SLOW_SCHEMA), "max_new_tokens": 4}}
    started = time.monotonic()
    first = _post(api, "/generate", body, timeout=120)
    elapsed = time.monotonic() - started
    assert first.status_code == 400 and "--grammar-compile-timeout" in first.json()["error"]["message"]
    assert COMPILE_BOUND_S <= elapsed < COMPILE_BOUND_S + 20
    started = time.monotonic()
    again = _post(api, "/generate", body, timeout=120)
    assert again.status_code == 400 and time.monotonic() - started < COMPILE_BOUND_S
    ok = _generate(api, "Is it?", regex="(yes|no)", max_new_tokens=4)
    assert ok["text"] in ("yes", "no")


def test_a_grammar_that_cannot_end_within_max_tokens_finishes_with_length(api):
    body = _ok(api, COMPLETIONS, {"prompt": "Letters: ", "regex": "[a-z]{60}", "max_tokens": 5, "temperature": 0})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and re.fullmatch("[a-z]+", choice["text"])
    assert body["usage"]["completion_tokens"] == 5


def test_constrained_and_free_requests_in_one_batch_give_what_they_give_alone(api):
    texts = ["A person as JSON: ", "The capital of France is", "My phone number is ", "Once upon a time"]
    params = [{"json_schema": json.dumps(PERSON)}, {}, {"regex": PHONE}, {"ignore_eos": True}]
    params = [{"temperature": 0, "max_new_tokens": 24, **p} for p in params]
    alone = [_ok(api, "/generate", {"text": t, "sampling_params": p})["output_ids"] for t, p in zip(texts, params)]
    batched = _ok(api, "/generate", {"text": texts, "sampling_params": params})
    assert [r["output_ids"] for r in batched] == alone


def test_grammar_queue_in_the_decode_line_and_metrics(api):
    _generate(api, "A person as JSON: ", json_schema=json.dumps(PERSON), max_new_tokens=8)
    metrics = requests.get(api.url + "/metrics", timeout=30).text
    assert re.search(r"^sglang:num_grammar_queue_reqs\{[^}]*\} 0\.0$", metrics, re.M), metrics[:2000]
    lines = api.log_file.read_text().splitlines()
    assert any(re.search(r"Decode batch\. .*#queue-req: \d+, #grammar-queue-req: \d+$", line) for line in lines)


def test_logit_bias_steers_and_bans_tokens(api):
    token = _ok(api, "/tokenize", {"prompt": " banana", "add_special_tokens": False})["tokens"][0]
    forced = _ok(api, COMPLETIONS, {"prompt": "Hello", "max_tokens": 4, "temperature": 0,
                                    "logit_bias": {str(token): 100}})
    assert forced["choices"][0]["text"] == " banana" * 4
    free = _generate(api, "The capital of France is", max_new_tokens=3)
    banned = _ok(api, "/generate", {"text": "The capital of France is", "sampling_params": {
        "temperature": 0, "max_new_tokens": 3, "logit_bias": {str(free["output_ids"][0]): -100}}})
    assert banned["output_ids"][0] != free["output_ids"][0]
    bad = _post(api, COMPLETIONS, {"prompt": "Hi", "logit_bias": {"99999999": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias"


def test_echo_leads_with_the_prompt(api):
    body = _ok(api, COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
                                  "echo": True})
    free = _ok(api, COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert body["choices"][0]["text"] == "The capital of France is" + free["choices"][0]["text"]
    response = requests.post(api.url + COMPLETIONS, json={"prompt": "Hi there", "max_tokens": 3, "temperature": 0,
                                                          "echo": True, "stream": True}, stream=True, timeout=120)
    events = [json.loads(line[6:]) for line in response.iter_lines(decode_unicode=True)
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events).startswith("Hi there")


def test_tokenize_and_detokenize_in_vllms_shapes(api):
    body = _ok(api, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) and body["max_model_len"] > 0
    assert _ok(api, "/detokenize", {"tokens": body["tokens"]})["prompt"] == "Hello world"
    chat = _ok(api, "/v1/tokenize", {"messages": ASK})
    prompt = _ok(api, CHAT, {"messages": ASK, "max_tokens": 1})["usage"]["prompt_tokens"]
    assert chat["count"] == prompt
    for path, bad, param in [("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {}, "prompt"),
                             ("/detokenize", {"tokens": [10**9]}, "tokens"), ("/detokenize", {"tokens": "x"}, "tokens")]:
        response = _post(api, path, bad)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


# ---- tools ----

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
                   "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
WEATHER_ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def _calls(body: dict) -> list[dict]:
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    for call in calls:
        spec = next(t for t in (WEATHER, ADD) if t["function"]["name"] == call["function"]["name"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), spec["function"]["parameters"])
        assert call["type"] == "function" and call["id"].startswith("call_")
    return calls


def _chat(server, **body) -> dict:
    return _ok(server, CHAT, {"messages": WEATHER_ASK, "tools": [WEATHER, ADD], "max_tokens": 60, "temperature": 0,
                              **body})


def test_tool_choice_required_and_named_always_give_a_call_that_parses(api):
    assert len(_calls(_chat(api, tool_choice="required"))) == 1
    (named,) = _calls(_chat(api, tool_choice={"type": "function", "function": {"name": "add"}}))
    assert named["function"]["name"] == "add"


def test_tool_choice_none_and_auto_answer(api):
    none = _chat(api, tool_choice="none")["choices"][0]
    assert "tool_calls" not in none["message"] and none["message"]["content"]
    auto = _chat(api)["choices"][0]
    assert auto["finish_reason"] in ("stop", "length", "tool_calls")


def _streamed_chat(server, **body) -> tuple[list[dict], str, list[tuple[str, str]]]:
    """(events, content, calls) of a streamed chat: the content deltas joined, each call's name and its arguments
    fragments joined, checking OpenAI's shape (the first delta of a call opens it, the rest carry fragments only)."""
    response = requests.post(server.url + CHAT, stream=True, timeout=900, json={
        "messages": WEATHER_ASK, "tools": [WEATHER, ADD], "max_tokens": 60, "temperature": 0, "stream": True, **body})
    # NOTE: SSE is UTF-8 (requests would guess Latin-1 for a text/* type without a charset)
    lines = [line.decode("utf-8") for line in response.iter_lines()]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert all(d.get("content") or d.get("role") or d.get("tool_calls") for d in deltas[:-1])
    calls: list[list[str]] = []
    for call in (c for d in deltas for c in d.get("tool_calls", [])):
        if call["index"] == len(calls):
            assert call["id"].startswith("call_") and call["type"] == "function" and call["function"]["arguments"] == ""
            calls.append([call["function"]["name"], ""])
        else:
            assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            calls[call["index"]][1] += call["function"]["arguments"]
    return events, "".join(d.get("content") or "" for d in deltas), [tuple(c) for c in calls]


TOOL_CHOICES = {"auto": {}, "required": {"tool_choice": "required"},
                "named": {"tool_choice": {"type": "function", "function": {"name": "add"}}}}


def _stream_equals_the_response(server, choice: str) -> None:
    plain = _chat(server, **TOOL_CHOICES[choice])["choices"][0]
    events, content, calls = _streamed_chat(server, **TOOL_CHOICES[choice])
    assert content == (plain["message"]["content"] or "")
    expected = plain["message"].get("tool_calls", [])
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in expected]
    assert events[-1]["choices"][0]["finish_reason"] == plain["finish_reason"]
    if choice != "auto":
        assert plain["finish_reason"] == "tool_calls" and len(calls) == 1
        assert sum(1 for e in events for c in e["choices"][0]["delta"].get("tool_calls", [])) > 2  # in pieces
        assert "<tool_call>" not in content and "arguments" not in calls[0][1]


@pytest.mark.parametrize("choice", sorted(TOOL_CHOICES))
def test_streamed_tool_calls_arrive_in_pieces_and_equal_the_response(api, choice):
    _stream_equals_the_response(api, choice)


def test_a_conversation_with_earlier_calls_and_their_results(api):
    messages = WEATHER_ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    body = _ok(api, CHAT, {"messages": messages, "tools": [WEATHER], "max_tokens": 20, "temperature": 0,
                           "tool_choice": "none"})
    assert body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": "get_weather"}, "tools"),
])
def test_bad_tools_are_a_400_naming_the_field(api, body, param):
    response = _post(api, CHAT, {"messages": WEATHER_ASK, **body}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


QWEN_STYLE_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}

You may call functions; their signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each call, answer with a JSON object of the function's name and arguments inside <tool_call></tool_call>.<|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}{% if message['role'] != 'system' %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}{% for c in message.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def qwen_api(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen-template")
    (folder / "template.jinja").write_text(QWEN_STYLE_TEMPLATE)
    process = ServerProcess("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "8000",
                            "--chat-template", str(folder / "template.jinja"),
                            "--tool-call-parser", "qwen25").wait_healthy()
    yield process
    process.stop()


def test_qwen25_parser_with_a_template_that_renders_tools(qwen_api):
    (call,) = _calls(_chat(qwen_api, tool_choice="required"))
    (named,) = _calls(_chat(qwen_api, tool_choice={"type": "function", "function": {"name": "add"}}))
    assert named["function"]["name"] == "add"
    messages = WEATHER_ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                              {"role": "tool", "tool_call_id": call["id"], "content": "18 C"}]
    assert _ok(qwen_api, CHAT, {"messages": messages, "tools": [WEATHER], "max_tokens": 8})["choices"]


@pytest.mark.parametrize("choice", sorted(TOOL_CHOICES))
def test_qwen25_streamed_tool_calls_equal_the_response(qwen_api, choice):
    _stream_equals_the_response(qwen_api, choice)


# ---- 64 concurrent mixed requests ----

def _mixed_requests() -> list[tuple[str, dict, str]]:
    """16 distinct requests (endpoint, body, kind): JSON schema, regex, tool call, free; each sent 4 times."""
    people = ["Ana, aged 31", "Ben, aged 45", "Cid, aged 8", "Dee, aged 77"]
    questions = ["What is the weather in Rome?", "Add 2 and 40.", "Is it raining in Oslo?", "What is 7 plus 8?"]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    greedy = {"temperature": 0}
    out = []
    for person in people:
        out.append((CHAT, {"messages": [{"role": "user", "content": f"Describe {person}, as JSON."}],
                           "response_format": fmt, "max_tokens": 64, **greedy}, "schema"))
    for prompt, pattern in [("My phone number is ", PHONE), ("Today's date is ", r"\d{4}-\d{2}-\d{2}"),
                            ("Is water wet? Answer: ", "(yes|no)"), ("A hex colour: ", "#[0-9a-f]{6}")]:
        out.append((COMPLETIONS, {"prompt": prompt, "regex": pattern, "max_tokens": 24, **greedy}, pattern))
    for question in questions:
        out.append((CHAT, {"messages": [{"role": "user", "content": question}], "tools": [WEATHER, ADD],
                           "tool_choice": "required", "max_tokens": 60, **greedy}, "tools"))
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The best way to learn"]:
        out.append((COMPLETIONS, {"prompt": prompt, "max_tokens": 24, "ignore_eos": True, **greedy}, "free"))
    return out


def _answer(server, path: str, body: dict) -> str:
    choice = _ok(server, path, body)["choices"][0]
    if path == COMPLETIONS:
        return choice["text"]
    message = choice["message"]
    return json.dumps(message.get("tool_calls") and [c["function"] for c in message["tool_calls"]]) + \
        (message["content"] or "")


def _valid(kind: str, path: str, answer: str, body: dict) -> None:
    if kind == "schema":
        jsonschema.validate(json.loads(answer.removeprefix("null")), PERSON)
    elif kind == "tools":
        calls = json.loads(answer)
        assert calls and calls[0]["name"] in ("get_weather", "add")
        spec = WEATHER if calls[0]["name"] == "get_weather" else ADD
        jsonschema.validate(json.loads(calls[0]["arguments"]), spec["function"]["parameters"])
    elif kind != "free":
        assert re.fullmatch(kind, answer), (kind, answer)


def test_64_concurrent_mixed_requests_are_valid_and_equal_their_single_runs(api):
    import concurrent.futures

    requests_ = _mixed_requests()
    alone = [_answer(api, path, body) for path, body, _ in requests_]
    for (path, body, kind), answer in zip(requests_, alone):
        _valid(kind, path, answer, body)
    batch = requests_ * 4
    with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
        answers = list(pool.map(lambda r: _answer(api, r[0], r[1]), batch))
    assert answers == alone * 4
    info = requests.get(api.url + "/get_server_info", timeout=30).json()["internal_states"][0]
    assert not info["memory_leak_detected"]
