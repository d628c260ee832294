"""Reading tool calls as far as they are written: each call's JSON envelope (`{"name": ..., "arguments": {...}}`,
Llama's `"parameters"`) found from a call's marker on, with its name once complete and the raw span of its
arguments object so far. The stream sends those spans as they grow; the finished response takes the same spans,
so the streamed fragments add up to exactly the non-streamed arguments (the model's own text, as OpenAI's).

The separators between calls (`, ` inside SmolLM2's list, Llama's `;`) hold no `{`: the next envelope starts at the
next `{` after the previous one closed, unless a call block closed first (`</tool_call>`): then only inside the next
block (`<tool_call>`), so text after the calls is never read as one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class CallSpan:
    """One call's envelope as scanned so far."""

    name: str | None = None
    args_start: int | None = None  # where its arguments object starts in the text
    args_end: int | None = None  # just after it, once closed
    end: int | None = None  # just after the envelope, once closed

    def arguments(self, text: str) -> str:
        """The arguments' text written so far (all of it once `args_end` is known)."""
        if self.args_start is None:
            return ""
        return text[self.args_start : self.args_end if self.args_end is not None else len(text)]


def scan_calls(text: str, start: int, block: tuple[str, str] | None = None) -> list[CallSpan]:
    """The envelopes from `start` on, inside `block`'s (opening, closing) tags where calls are so wrapped; the last
    may be unfinished."""
    spans: list[CallSpan] = []
    position = start
    while (opening := text.find("{", position)) >= 0:
        closed = text.find(block[1], position) if block else -1
        if 0 <= closed < opening:
            reopened = text.find(block[0], closed)
            if reopened < 0:
                break
            position = reopened + len(block[0])
            continue
        span = _scan_envelope(text, opening)
        spans.append(span)
        if span.end is None:
            break
        position = span.end
    return spans


def _string_end(text: str, start: int) -> int | None:
    """Just after the JSON string opening at `start`; None while it is unfinished."""
    position = start + 1
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2
        elif char == '"':
            return position + 1
        else:
            position += 1
    return None


def _string_value(literal: str) -> str | None:
    try:
        return json.loads(literal)
    except json.JSONDecodeError:
        return None


def _scan_envelope(text: str, opening: int) -> CallSpan:
    span = CallSpan()
    depth, key, expects_key, position = 0, None, True, opening
    while position < len(text):
        char = text[position]
        if char == '"':
            end = _string_end(text, position)
            if end is None:
                return span
            if depth == 1:
                value = _string_value(text[position:end])
                if expects_key:
                    key = value
                elif key == "name" and span.name is None:
                    span.name = value
            position = end
            continue
        if depth == 1 and char == ":":
            expects_key = False
            if key in ARGUMENT_KEYS and span.args_start is None:
                value_at = len(text) - len(text[position + 1 :].lstrip())
                if value_at < len(text) and text[value_at] == "{":
                    span.args_start = value_at
        elif depth == 1 and char == ",":
            expects_key, key = True, None
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 1 and span.args_start is not None and span.args_end is None and position > span.args_start:
                span.args_end = position + 1
            if depth == 0:
                span.end = position + 1
                return span
        position += 1
    return span
