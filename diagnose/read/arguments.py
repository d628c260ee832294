"""The server's arguments as its log prints them (docs/log-formats.md §5, §9.3): SGLang's `server_args=ServerArgs(...)`,
vLLM's `non-default args: {...}` and its engine config (`Initializing a V1 LLM engine (v0.11.0) with config: ...`);
values that are not plain literals (lists, enums, paths) are kept as their source text.
"""
from __future__ import annotations

import ast
import re

from toolkit.diagnose.read.values import Fields, Value

_VERSION = re.compile(r"LLM engine \(v([^)]{1,40})\)")
_CAPTURE_SIZE = re.compile(r"['\"]max_(?:cudagraph_)?capture_size['\"]: (\d{1,10})")
_CAPTURE_SIZES = re.compile(r"['\"]cudagraph_capture_sizes['\"]: \[([\d, ]{0,4000})\]")


def _engine_config(text: str) -> dict[str, Value]:
    """`Initializing a V1 LLM engine (v0.11.0) with config: model='m', ..., tensor_parallel_size=2, ...`."""
    out: dict[str, Value] = {}
    version = _VERSION.search(text)
    if version is not None:
        out["version"] = version.group(1)
    body = text.partition("with config: ")[2]
    for item in _top_level_items(body):
        for key, raw in _items_of(item):
            out[key] = _literal(raw)
    size = _CAPTURE_SIZE.search(body)
    sizes = _CAPTURE_SIZES.search(body)
    if size is not None:
        out["max_cudagraph_capture_size"] = int(size.group(1))
    elif sizes is not None and sizes.group(1).strip():
        out["max_cudagraph_capture_size"] = max(int(x) for x in sizes.group(1).split(",") if x.strip())
    return out


# NOTE: V0 (0.6) prints two items with no comma between them: `chunked_prefill_enabled=False
# multi_step_stream_outputs=True`; an unquoted value ends where a blank and the next `key=` begin
_GLUED_ITEM = re.compile(r"\s+(?=[A-Za-z_]\w*=)")


def _items_of(item: str) -> list[tuple[str, str]]:
    """The `key=value` pairs of one comma-separated item of the engine config (one, or more glued by a blank)."""
    key, sep, raw = item.partition("=")
    if not (sep and key.strip().isidentifier()):
        return []
    raw = raw.strip()
    if raw[:1] in "'\"([{":
        return [(key.strip(), raw)]
    value, *glued = _GLUED_ITEM.split(raw, maxsplit=1)
    return [(key.strip(), value)] + (_items_of(glued[0]) if glued else [])


def _engine_args(text: str) -> dict[str, Value]:
    return parse_server_args(text.partition("non-default args: ")[2])


# -- server_args=ServerArgs(...) -------------------------------------------------------------------

_OPEN, _CLOSE = "([{", ")]}"


def _top_level_items(body: str) -> list[str]:
    """Split `body` at commas outside quotes and brackets; stops at the unmatched closing bracket."""
    items, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(body):
        c = body[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:i])
    return [item.strip() for item in items if item.strip()]


def _literal(text: str) -> Value:
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text
    return v if isinstance(v, (int, float, bool, str)) or v is None else text


def parse_server_args(text: str) -> dict[str, Value]:
    """`ServerArgs(model_path='m', tp_size=2, ...)` or a `{'model_path': 'm', ...}` dict -> a dict.
    Values that are not plain literals (lists, enums, paths) are kept as their source text."""
    text = text.strip()
    if text.startswith("server_args="):
        text = text[len("server_args="):]
    dict_form = text.startswith("{")
    start = 1 if dict_form else text.find("(") + 1
    out: dict[str, Value] = {}
    for item in _top_level_items(text[start:] if start > 0 else text):
        if dict_form:
            key, sep, raw = item.partition(":")
            key = key.strip().strip("'\"")
        else:
            key, sep, raw = item.partition("=")
            key = key.strip()
        if sep and key.isidentifier():
            out[key] = _literal(raw.strip())
    return out


FIELDS: dict[str, Fields] = {
    "server_args": Fields(parse_server_args, {}, open=True),
    "engine_args": Fields(_engine_args, {}, open=True),
    "engine_config": Fields(_engine_config, {"version": str, "max_cudagraph_capture_size": int}, open=True),
}

