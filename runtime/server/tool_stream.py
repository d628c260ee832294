"""A streamed chat choice with tools, as OpenAI streams it: text before a call goes out as `content` at once; a call
goes out as it is written, a first delta with its `index`, `id`, `type` and `function.name` (arguments ""), then its
`function.arguments` fragments (only `index` and the fragment); the call's markup (tags, the envelope's keys) never
goes out. Content and arguments add up to what the finished response says (`ToolPlan.split`)."""
from __future__ import annotations

from typing import Any

from toolkit.runtime.server.call_scan import scan_calls
from toolkit.runtime.server.tool_calls import ToolPlan, call_id


def _opening(index: int, call_id: str, name: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": ""}}]}


def _fragment(index: int, arguments: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}


class ToolStream:
    """One choice's text so far, split into content passed on, text held back (maybe the start of a call), and the
    calls streamed."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of `text` passed on as content
        self.call_start: int | None = None  # where the first call's marker is, once seen
        self.ids: list[str] = []  # the calls opened so far
        self.args_sent: list[int] = []  # characters of each call's arguments passed on

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def push(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """The content and tool-call deltas the new text lets go of now."""
        self.text += delta
        if self.plan.mode == "none":
            return self._content_until(len(self.text)), []
        if self.call_start is None:
            start = self.plan.format.start(self.text)
            if start < 0:
                return self._content_until(self._held_from()), []
            self.call_start = start
            return self._content_until(len(self.text[:start].rstrip())), self._call_deltas()
        return "", self._call_deltas()

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left once the choice has ended: held text that was no call goes out as content."""
        deltas = self._call_deltas() if self.call_start is not None else []
        if self.called:
            return "", deltas
        return self._content_until(len(self.text)), []

    def _content_until(self, end: int) -> str:
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _held_from(self) -> int:
        """Text from here on may lead into a call: a partial marker, or whitespace (which a call would strip)."""
        held = len(self.text)
        for marker in self.plan.format.markers:
            for keep in range(min(len(marker) - 1, len(self.text)), 0, -1):
                if self.text.endswith(marker[:keep]):
                    held = min(held, len(self.text) - keep)
                    break
        return len(self.text[:held].rstrip())

    def _call_deltas(self) -> list[dict[str, Any]]:
        spans = scan_calls(self.text, self.call_start, self.plan.format.block)
        if not self.plan.parallel:
            spans = spans[:1]
        deltas: list[dict[str, Any]] = []
        for index, span in enumerate(spans):
            if span.name is None:
                break
            if index == len(self.ids):
                self.ids.append(call_id())
                self.args_sent.append(0)
                deltas.append(_opening(index, self.ids[index], span.name))
            arguments = span.arguments(self.text)
            if len(arguments) > self.args_sent[index]:
                deltas.append(_fragment(index, arguments[self.args_sent[index] :]))
                self.args_sent[index] = len(arguments)
            if span.end is None:
                break
        return deltas
