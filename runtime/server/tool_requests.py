"""The `tools`, `tool_choice` and `parallel_tool_calls` of a chat request, and the prompt they make: a template
that renders tools gets them as they are; for one that does not, the tools go in a system message and earlier calls
are written as the model writes them (`tool_calls` has the formats)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from toolkit.runtime.sampling.sampling_params import shown
from toolkit.runtime.server import limits
from toolkit.runtime.server.request_fields import bad, boolean, valid_text
from toolkit.runtime.server.tool_calls import FORMATS, Tool, ToolCall, ToolChoiceMode, ToolFormat, ToolPlan


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PARAMETERS = {"type": "object", "properties": {}}


def tool_plan(body: dict, parser: str) -> ToolPlan | None:
    """The request's tools, choice and format (`parser`: the chat template's); None without tools."""
    tools = [_tool(t, i) for i, t in enumerate(_tool_list(body))]
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise bad("tool_choice", "needs tools")
        return None
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad("tools", "function names must be unique")
    mode, named = _tool_choice(choice, names)
    return ToolPlan(FORMATS[parser], tools, mode, named, boolean(body, "parallel_tool_calls", True))


def _tool_list(body: dict) -> list:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "must be a list of function tools")
    if len(tools) > limits.MAX_TOOLS:
        raise bad("tools", f"at most {limits.MAX_TOOLS} tools are allowed, got {len(tools)}")
    return tools


def _tool(tool: Any, index: int) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise bad(where, 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise bad(f"{where}.function.name", "must be 1-64 letters, digits, underscores or dashes")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise bad(f"{where}.function.description", "must be a string")
    parameters = function.get("parameters", _NO_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad(f"{where}.function.parameters", "must be a JSON schema object")
    return Tool(name, valid_text(description, f"{where}.function.description"), parameters)


def _tool_choice(choice: Any, names: list[str]) -> tuple[ToolChoiceMode, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad("tool_choice", 'must be "none", "auto", "required" or {"type": "function", "function": {"name": '
                                 '...}}')
    if name not in names:
        raise bad("tool_choice", f"names the function {shown(name)}, which is not among the tools")
    return "named", name


def encode_tool_chat(messages: list[dict], tools: ToolPlan | None, encode_chat: Callable[..., list[int]],
                     native_tools: bool) -> list[int]:
    """The prompt: a template that renders tools gets them (and the calls in earlier messages) as they are; for
    one that does not, the tools are described in a system message and earlier calls written as the model writes
    them."""
    if tools is None:
        return encode_chat(_plain_messages(messages, None))
    if native_tools:
        return encode_chat(messages, tools=[t.openai() for t in tools.tools])
    prompt = tools.format.system_prompt(tools.tools)
    plain = _plain_messages(messages, tools.format)
    if plain[0]["role"] == "system":
        plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{prompt}"}
    else:
        plain.insert(0, {"role": "system", "content": prompt})
    return encode_chat(plain)


def _plain_messages(messages: list[dict], fmt: ToolFormat | None) -> list[dict]:
    """Role and content only; an assistant's earlier calls become its text."""
    plain = []
    for m in messages:
        content = m["content"] or ""
        if m.get("tool_calls"):
            calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            written = (fmt or FORMATS["smollm2"]).written(calls)
            content = f"{content}\n{written}" if content else written
        plain.append({"role": m["role"], "content": content})
    return plain


def message_calls(message: dict, where: str) -> list[dict] | None:
    """An assistant message's earlier `tool_calls`, with their arguments as JSON text."""
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls", "must be a list of tool calls")
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str) or not isinstance(_json_object(function["arguments"]), dict):
            raise bad(f"{where}.tool_calls[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                                                  "\"arguments\": a JSON object's text}}")
    return calls


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
