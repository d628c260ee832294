"""Tool calling in the chat template's format (`--tool-call-parser`, SGLang's name): how the tools reach the
prompt, the grammar that makes `tool_choice` `required` or a named function always produce a call that parses,
and the parser that turns generated text back into OpenAI `tool_calls`.

| parser    | a call, as the model writes it                                           | models                   |
|-----------|--------------------------------------------------------------------------|--------------------------|
| `qwen25`  | `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>` (one per call) | Qwen2.5, Qwen3          |
| `llama3`  | `{"name": "f", "parameters": {...}}` (calls separated by `;`)            | Llama 3.1 / 3.2 / 3.3    |
| `smollm2` | `<tool_call>[{"name": "f", "arguments": {...}}]</tool_call>`              | SmolLM2 (the embedded)  |

Templates that render `tools` themselves (Qwen2.5's, Llama 3.x's) get them as the `tools` variable; for one that does
not (SmolLM2's), the tools and the call format are described in a system message, as SmolLM2 was taught."""
from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from toolkit.runtime.server.call_scan import scan_calls

ToolChoiceMode = Literal["auto", "none", "required", "named"]
TOOL_CALL_PARSERS = ("llama3", "qwen25", "smollm2")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The OpenAI `tools` entry, as templates read it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as the model wrote it
    id: str = field(default_factory=call_id)

    def openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


class ToolFormat(ABC):
    """One chat template family's way of writing calls."""

    name: str
    marker: str  # generated text from here on is a call (what the stream holds back)
    block: tuple[str, str] | None = None  # the tags every call is wrapped in, if any

    @abstractmethod
    def call_tag(self, tool: Tool) -> dict[str, Any]:
        """The structural tag (xgrammar's `tag` format) of one call of `tool`."""

    @abstractmethod
    def calls(self, text: str) -> list[ToolCall] | None:
        """The calls in `text` (from the marker on); None when it is not a well-formed call."""

    @abstractmethod
    def written(self, calls: list[ToolCall]) -> str:
        """Earlier calls as the model would have written them (for templates that cannot render tool_calls)."""

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls): the text before the first call, and the calls; all content when none parses."""
        start = self.start(text)
        if start < 0:
            return text, []
        calls = self.calls(text[start:])
        if not calls:
            return text, []
        # NOTE: the arguments as the model wrote them (what a stream sends), where every call's are found
        raw = [span.arguments(text) for span in scan_calls(text, start, self.block)]
        if len(raw) == len(calls) and all(raw):
            calls = [replace(call, arguments=arguments) for call, arguments in zip(calls, raw)]
        return text[:start].rstrip(), calls

    def start(self, text: str) -> int:
        return text.find(self.marker)

    @property
    def markers(self) -> tuple[str, ...]:
        """What may open a call (a stream holds back a partial one)."""
        return (self.marker,)

    def system_prompt(self, tools: list[Tool]) -> str:
        listed = json.dumps([t.openai()["function"] for t in tools], ensure_ascii=False)
        example = self.written([ToolCall("function_name", '{"argument": "value"}', id="")])
        return ("You can call these functions to answer the user. They are listed in JSON inside <tools></tools>:\n"
                f"<tools>{listed}</tools>\n"
                f"To call one, answer with the call alone, written exactly as: {example}")


def _arguments(value: Any) -> str | None:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def _call(item: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = _arguments(item.get(arguments_key, item.get("arguments", {})))
    return None if arguments is None else ToolCall(item["name"], arguments)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


# a `<tool_call>...</tool_call>` block's body (Qwen2.5's and SmolLM2's templates both wrap calls so)
TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class QwenFormat(ToolFormat):
    name = "qwen25"
    marker = "<tool_call>"
    block = ("<tool_call>", "</tool_call>")

    def call_tag(self, tool: Tool) -> dict[str, Any]:
        return {"type": "tag", "begin": f'<tool_call>\n{{"name": {json.dumps(tool.name)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": "}\n</tool_call>"}

    def calls(self, text: str) -> list[ToolCall] | None:
        found = [_call(_json(body)) for body in TOOL_CALL_BLOCK.findall(text)]
        return found if found and all(found) else None

    def written(self, calls: list[ToolCall]) -> str:
        return "\n".join(f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n</tool_call>'
                         for c in calls)


class SmolFormat(ToolFormat):
    name = "smollm2"
    marker = "<tool_call>"
    block = ("<tool_call>", "</tool_call>")

    def call_tag(self, tool: Tool) -> dict[str, Any]:
        return {"type": "tag", "begin": f'<tool_call>[{{"name": {json.dumps(tool.name)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": "}]</tool_call>"}

    def calls(self, text: str) -> list[ToolCall] | None:
        found: list[ToolCall | None] = []
        for body in TOOL_CALL_BLOCK.findall(text):
            items = _json(body)
            found += [_call(item) for item in items] if isinstance(items, list) else [_call(items)]
        return found if found and all(found) else None

    def written(self, calls: list[ToolCall]) -> str:
        items = ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}' for c in calls)
        return f"<tool_call>[{items}]</tool_call>"


class LlamaFormat(ToolFormat):
    """Llama 3.x's JSON calls; the model may open with `<|python_tag|>`."""

    name = "llama3"
    marker = "{"
    _TAG = "<|python_tag|>"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.marker, self._TAG)

    def start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith(self._TAG):
            return len(text) - len(stripped)
        return len(text) - len(stripped) if stripped.startswith("{") else -1

    def call_tag(self, tool: Tool) -> dict[str, Any]:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(tool.name)}, "parameters": ',
                "content": {"type": "json_schema", "json_schema": tool.parameters}, "end": "}"}

    def calls(self, text: str) -> list[ToolCall] | None:
        text = text.strip().removeprefix(self._TAG)
        found = [_call(_json(part), "parameters") for part in text.split(";") if part.strip()]
        return found if found and all(found) else None

    def written(self, calls: list[ToolCall]) -> str:
        return "; ".join(f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments}}}' for c in calls)


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (QwenFormat(), LlamaFormat(), SmolFormat())}


def detect_parser(template: str | None) -> str:
    """The format a chat template writes calls in: Qwen's `<tool_call>` tags, Llama 3's JSON (`<|python_tag|>`,
    `ipython`), else SmolLM2's."""
    text = template or ""
    if "<tool_call>" in text and "tools" in text:
        return "qwen25"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3"
    return "smollm2"


def renders_tools(template: str | None) -> bool:
    """The template reads the `tools` variable itself."""
    return bool(template) and re.search(r"\btools\b", template) is not None


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request asked of tools, resolved: the format, the tools, the choice."""

    format: ToolFormat
    tools: list[Tool]
    mode: ToolChoiceMode
    named: str | None = None
    parallel: bool = True

    def structural_tag(self) -> str | None:
        """The grammar of `required` (one call of any tool) or a named function (one call of it); None otherwise."""
        if self.mode == "named":
            tag = self.format.call_tag(next(t for t in self.tools if t.name == self.named))
        elif self.mode == "required":
            tag = {"type": "or", "elements": [self.format.call_tag(t) for t in self.tools]}
        else:
            return None
        return json.dumps({"type": "structural_tag", "format": tag})

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a finished choice; `none` never calls."""
        if self.mode == "none":
            return text, []
        content, calls = self.format.split(text)
        return content, calls if self.parallel else calls[:1]
