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
    ToolStream,
    detect_parser,
    renders_tools,
    tool_call_deltas,
)

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


def test_a_stream_holds_back_a_call_and_sends_it_as_deltas():
    stream = ToolStream(ToolPlan(FORMATS["smollm2"], [WEATHER], "auto"))
    sent = "".join(stream.push(piece) for piece in ["Sure. ", "<tool", '_call>[{"name": "get_weather", ',
                                                    '"arguments": {"city": "Paris"}}]</tool_call>'])
    assert sent == "Sure. "
    rest, calls = stream.finish()
    assert rest == "" and calls[0].name == "get_weather"
    first, arguments = tool_call_deltas(calls)
    assert first["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert json.loads(arguments["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    plain = ToolStream(ToolPlan(FORMATS["smollm2"], [WEATHER], "auto"))
    assert plain.push("a <tool") == "a " and plain.finish() == ("<tool", [])


def test_the_format_is_read_from_the_chat_template():
    assert detect_parser("{% for tool in tools %}...<tool_call>{% endfor %}") == "qwen25"
    assert detect_parser("{{- '<|python_tag|>' }}{% if tools %}") == "llama3"
    smol = load_tokenizer(None).chat_template
    assert detect_parser(smol) == "smollm2" and not renders_tools(smol)
    assert renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
