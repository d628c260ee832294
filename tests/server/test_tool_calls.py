"""Tool-call formats without a model: each parser reads back what its format writes, the grammar of `required` and
of a named function (xgrammar's structural tag, compiled against the embedded tokenizer) accepts exactly a written
call, a stream holds back text from a call's marker on, and the format is read from the chat template."""
from __future__ import annotations

import json

import pytest
import xgrammar

from toolkit.runtime.model_loader.tokenizer import load_tokenizer
from toolkit.runtime.server.tool_calls import (
    FORMATS,
    Tool,
    ToolCall,
    ToolPlan,
    detect_parser,
    renders_tools,
)
from toolkit.runtime.server.tool_stream import ToolStream

WEATHER = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]})
ADD = Tool("add", "Add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "required": ["a", "b"]})
CALL = ToolCall("get_weather", '{"city": "Paris"}')


@pytest.fixture(scope="module")
def compiler():
    tokenizer = load_tokenizer(None)
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152, stop_token_ids=[2])
    return xgrammar.GrammarCompiler(info)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_parser_reads_back_what_its_format_writes(name):
    fmt = FORMATS[name]
    content, calls = fmt.split(fmt.written([CALL]))
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert fmt.split("Just text, no call.") == ("Just text, no call.", [])
    assert fmt.split(fmt.written([CALL])[:-3])[1] == []  # a cut call is not a call


def test_qwen_reads_several_calls_and_the_text_before_them():
    fmt = FORMATS["qwen25"]
    text = "Let me check.\n" + fmt.written([CALL, ToolCall("add", '{"a": 1, "b": 2}')])
    content, calls = fmt.split(text)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather", "add"]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_required_and_named_grammars_accept_exactly_a_written_call(compiler, name):
    fmt = FORMATS[name]
    for plan, good, wrong in [
        (ToolPlan(fmt, [WEATHER, ADD], "required"), fmt.written([ToolCall("add", '{"a": 1, "b": 2}')]),
         fmt.written([ToolCall("mul", '{"a": 1}')])),
        (ToolPlan(fmt, [WEATHER, ADD], "named", "get_weather"), fmt.written([CALL]),
         fmt.written([ToolCall("add", '{"a": 1, "b": 2}')])),
    ]:
        grammar = compiler.compile_structural_tag(plan.structural_tag())
        matcher = xgrammar.GrammarMatcher(grammar)
        assert matcher.accept_string(good) and matcher.is_completed(), good
        assert not xgrammar.GrammarMatcher(grammar).accept_string(wrong)
    assert ToolPlan(fmt, [WEATHER], "auto").structural_tag() is None


def _streamed(plan: ToolPlan, pieces: list[str]) -> tuple[str, list[dict]]:
    """(content, tool-call deltas) a stream sends for `pieces`, finish included."""
    stream, content, deltas = ToolStream(plan), "", []
    for piece in pieces:
        text, more = stream.push(piece)
        content, deltas = content + text, deltas + more
    text, more = stream.finish()
    return content + text, deltas + more


def _assembled(deltas: list[dict]) -> list[tuple[str, str]]:
    """(name, arguments) per call from OpenAI deltas, checking their shape: the first of a call opens it with its
    index, id, type and name (arguments ""), the rest carry only the index and an arguments fragment."""
    calls: list[list[str]] = []
    for delta in deltas:
        (call,) = delta["tool_calls"]
        if call["index"] == len(calls):
            assert call["id"].startswith("call_") and call["type"] == "function" and call["function"]["arguments"] == ""
            calls.append([call["function"]["name"], ""])
        else:
            assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            assert call["function"]["arguments"] and call["index"] == len(calls) - 1
            calls[call["index"]][1] += call["function"]["arguments"]
    return [tuple(c) for c in calls]


ADD_CALL = ToolCall("add", '{"a": 1, "b": {"nested": [2, "}"]}}')
TEXTS = {
    "qwen25": ["Let me check. \n" + FORMATS["qwen25"].written([CALL, ADD_CALL]) + '\n{"name": "x", "arguments": {}}',
               '<tool_call>\n{"name":"get_weather","arguments":{"city":"P\\"aris"}}\n</tool_call>'],
    "smollm2": ["Sure. " + FORMATS["smollm2"].written([CALL, ADD_CALL]) + ' Then {"name": "x"} is no call.',
                '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'],
    "llama3": [" " + FORMATS["llama3"].written([CALL, ADD_CALL]),
               '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'],
}


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_stream_sends_calls_as_written_and_adds_up_to_the_whole_response(name, size):
    for text in TEXTS[name] + ["No call here, just words { and braces }."]:
        plan = ToolPlan(FORMATS[name], [WEATHER, ADD], "auto")
        content, calls = plan.split(text)
        streamed_content, deltas = _streamed(plan, [text[i : i + size] for i in range(0, len(text), size)])
        assert streamed_content == content
        assert _assembled(deltas) == [(c.name, c.arguments) for c in calls]
        assert all(json.loads(c.arguments) for c in calls)
        assert "<tool_call>" not in streamed_content or not calls


def test_arguments_stream_as_the_model_writes_them():
    plan = ToolPlan(FORMATS["qwen25"], [WEATHER], "required")
    pieces = ["<tool_call>", '\n{"name": "get_weather"', ', "arguments": {"ci', 'ty": "Pa', 'ris"}', "}\n</tool_call>"]
    stream = ToolStream(plan)
    sent = [stream.push(piece) for piece in pieces]
    assert [content for content, _ in sent] == [""] * len(pieces)
    fragments = [[c["function"]["arguments"] for d in deltas for c in d["tool_calls"]] for _, deltas in sent]
    assert fragments == [[], ["", ], ['{"ci'], ['ty": "Pa'], ['ris"}'], []]
    assert stream.finish() == ("", []) and stream.called


def test_a_single_call_stream_when_parallel_calls_are_off():
    plan = ToolPlan(FORMATS["smollm2"], [WEATHER, ADD], "auto", parallel=False)
    text = FORMATS["smollm2"].written([CALL, ADD_CALL])
    assert _assembled(_streamed(plan, list(text))[1]) == [(CALL.name, CALL.arguments)] == \
        [(c.name, c.arguments) for c in plan.split(text)[1]]


def test_held_text_that_is_no_call_goes_out_as_content():
    plan = ToolPlan(FORMATS["smollm2"], [WEATHER], "auto")
    stream = ToolStream(plan)
    assert stream.push("a <tool") == ("a", [])
    assert stream.finish() == (" <tool", []) and not stream.called
    assert _streamed(plan, ["Hi \n", "<tool_call>not json"]) == ("Hi \n<tool_call>not json", [])
    assert plan.split("Hi \n<tool_call>not json") == ("Hi \n<tool_call>not json", [])
    none = ToolPlan(FORMATS["smollm2"], [WEATHER], "none")
    written = FORMATS["smollm2"].written([CALL])
    assert _streamed(none, ["x ", written]) == ("x " + written, [])


def test_the_format_is_read_from_the_chat_template():
    assert detect_parser("{% for tool in tools %}...<tool_call>{% endfor %}") == "qwen25"
    assert detect_parser("{{- '<|python_tag|>' }}{% if tools %}") == "llama3"
    smol = load_tokenizer(None).chat_template
    assert detect_parser(smol) == "smollm2" and not renders_tools(smol)
    assert renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
