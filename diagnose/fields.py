"""Field reading: an event's message -> `{canonical_name: value}`.

Fields are read as an unordered `key: value` (or `key=value`) list; unknown keys are kept under their
canonical name and never required, so forks and future eras parse without a template (LOG_FORMATS §11).
"""
from __future__ import annotations

import ast
import re
from typing import Union

Value = Union[int, float, bool, str, None]

_DIGITS = frozenset("0123456789%")
_ITER = re.compile(r"\s*\[(\d+)\]")
_MIXED = re.compile(r"\(mixed #running-req: (\d+)\)")
_NON_WORD = re.compile(r"[^a-z0-9]+")

SYNONYMS: dict[str, str] = {
    "remaining_req": "queue_req",
    "seq": "new_seq",
    "full_token": "token",
    "gpu_token": "token",
    "full_token_usage": "token_usage",
    "gpu_token_usage": "token_usage",
    "npu_graph": "cuda_graph",
    "cpu_graph": "cuda_graph",
    "musa_graph": "cuda_graph",
    "gen_throughput_token_s": "gen_throughput",
    "input_throughput_token_s": "input_throughput",
    "tree_cache_hit_rate": "cache_hit_rate",
    "max_total_num_token": "max_total_num_tokens",
    "max_prefill_num_token": "max_prefill_tokens",
    "time_elapsed": "elapsed",
    "avaliable_tokens": "available_tokens",
}
# Per-pool usages whose maximum is the binding one (hybrid SWA / mamba models).
_USAGES = ("token_usage", "swa_token_usage", "mamba_usage")
_KEY_CACHE: dict[str, str] = {}


def canonical(key: str) -> str:
    """`"#running-req"` -> `"running_req"`, `"gen throughput (token/s)"` -> `"gen_throughput"`, synonyms merged."""
    name = _KEY_CACHE.get(key)
    if name is None:
        raw = key.strip().lstrip("#").strip().lower()
        raw = raw[5:] if raw.startswith("self.") else raw
        name = _NON_WORD.sub("_", raw).strip("_")
        name = SYNONYMS.get(name, name)
        if len(_KEY_CACHE) < 4096:
            _KEY_CACHE[key] = name
    return name


def value(text: str) -> Value:
    """`"0.82"` -> 0.82, `"True"` -> True, `"12.50%"` -> 0.125, `"78.50 GB"` -> 78.5, else the stripped text."""
    v = text.strip().rstrip(".,").strip()
    if v.isdigit():
        return int(v)
    if v == "True" or v == "False":
        return v == "True"
    if v == "None":
        return None
    percent = v.endswith("%")
    head = v[:-1] if percent else v.split(" ", 1)[0]
    if not head or head[-1] not in _DIGITS:
        return v
    try:
        number: int | float = int(head) if head.lstrip("-").isdigit() else float(head)
    except ValueError:
        return v
    return number / 100 if percent else number


def pairs(text: str) -> dict[str, Value]:
    """Every `key: value` / `key=value` piece of `text`, in canonical names."""
    out: dict[str, Value] = {}
    for piece in text.replace(". ", ",").split(","):
        key, sep, raw = piece.partition(": ")
        if not sep or "=" in key:
            key, sep, raw = piece.partition("=")
            if not sep:
                continue
        key = canonical(key)
        if not key:
            continue
        if "->" in raw:
            old, _, raw = raw.partition("->")
            out[key + "_old"] = value(old)
        out[key] = value(raw)
    return out


_LABELS = ("Decode batch", "Prefill batch", "new fill batch")


def _batch(text: str) -> dict[str, Value]:
    for label in _LABELS:
        i = text.find(label)
        if i >= 0:
            text = text[i + len(label):]
            break
    out: dict[str, Value] = {}
    m = _ITER.match(text)
    if m:
        out["iter"] = int(m.group(1))
    m = _MIXED.match(text)
    if m:
        out["mixed_running_req"] = int(m.group(1))
        text = text[m.end():]
    out.update(pairs(text))
    usages = [out[k] for k in _USAGES if isinstance(out.get(k), (int, float))]
    if usages:
        out["token_usage"] = max(usages)
    return out


_ACCESS = re.compile(r'(?P<client>\S{1,100}) - "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/(?P<http>[\d.]+)" (?P<status>\d{3})')


def _access(text: str) -> dict[str, Value]:
    m = _ACCESS.search(text)
    if m is None:
        return {}
    return {"client": m["client"], "method": m["method"], "path": m["path"], "status": int(m["status"])}


_OOM_NUMBERS = {
    "requested": re.compile(r"Try to allocate (\d+)"),
    "available_tokens": re.compile(r"Ava(?:ilable|liable) tokens: (\d+)"),
    "available_size": re.compile(r"available_size(?:\(\))?=(\d+)"),
    "evictable_size": re.compile(r"evictable_size(?:\(\))?=(\d+)"),
}
_OOM_PHASE = re.compile(r"(Prefill|Decode) out of memory")


def _oom(text: str) -> dict[str, Value]:
    m = _OOM_PHASE.search(text)
    out: dict[str, Value] = {"phase": m.group(1).lower() if m else "unknown"}
    for key, pattern in _OOM_NUMBERS.items():
        found = pattern.search(text)
        if found:
            out[key] = int(found.group(1))
    return out


_ASSIGN = re.compile(r"(?:self\.)?([A-Za-z_][\w.]{0,80}?)(?:\(\))?=(-?\d+(?:\.\d+)?)")


def _assignments(text: str) -> dict[str, Value]:
    return {canonical(k.rsplit(".", 1)[-1]): value(v) for k, v in _ASSIGN.findall(text)}


_WATCHDOG_NAME = re.compile(r"(\w{1,40}) watchdog timeout")
_SOFT = re.compile(r"soft=(True|False)")


def _watchdog(text: str) -> dict[str, Value]:
    out = {k: v for k, v in _assignments(text).items() if k == "watchdog_timeout"}
    name = _WATCHDOG_NAME.search(text)
    out["component"] = name.group(1) if name else "Scheduler"
    soft = _SOFT.search(text)
    if soft:
        out["soft"] = soft.group(1) == "True"
    return out


_ERROR_LINE = re.compile(r"^\s*([\w.]{0,80}(?:Error|Exception|Interrupt|Exit)\b.*)$", re.M)
_COMPONENT = re.compile(r"(\w{1,40}) hit an exception")


def _exception(text: str) -> dict[str, Value]:
    errors = _ERROR_LINE.findall(text)
    component = _COMPONENT.search(text)
    first = text.strip().splitlines()[0] if text.strip() else ""
    out: dict[str, Value] = {
        "component": component.group(1) if component else "",
        "error": errors[-1].strip() if errors else first.strip(),
    }
    if _OOM_PHASE.search(text):
        out["oom_phase"] = _oom(text)["phase"]
    return out


_CAPPED = re.compile(r"max_total_tokens=(-?\d+) is larger than the profiled value (-?\d+)")


def _capped(text: str) -> dict[str, Value]:
    m = _CAPPED.search(text)
    return {"max_total_tokens": int(m.group(1)), "profiled": int(m.group(2))} if m else {}


def _server_args(text: str) -> dict[str, Value]:
    return parse_server_args(text)


def _graph(text: str) -> dict[str, Value]:
    out = pairs(text)
    out["draft"] = "draft" in text[:40].lower()
    return out


def _message(text: str) -> dict[str, Value]:
    return {"message": text.strip()}


_READERS = {
    "decode": _batch,
    "prefill": _batch,
    "access": _access,
    "oom": _oom,
    "leak": _assignments,
    "watchdog": _watchdog,
    "exception": _exception,
    "tokens_capped": _capped,
    "server_args": _server_args,
    "graph_begin": _graph,
    "graph_end": _graph,
    "graph_failed": _message,
    "not_enough_memory": _message,
    "sigquit": _message,
}


def parse_fields(kind: str, text: str) -> dict[str, Value]:
    """The fields of one event's message; never raises, returns what could be read."""
    try:
        return _READERS.get(kind, pairs)(text)
    except Exception:  # noqa: BLE001 - a garbled line yields no fields, never an error
        return {}


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
