"""How a message's fields are written (docs/log-formats.md §8): an unordered `key: value` (or `key=value`) list,
read under canonical names (`#running-req` -> `running_req`, synonyms merged), unknown keys kept and none required,
so forks and future eras read without a template; and `Fields`, how each message kind declares its fields: its
reader and its schema (keys and types).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple, Union

Value = Union[int, float, bool, str, None]
Number = (int, float)  # a field's type where it may be printed either way


class Fields(NamedTuple):
    """A message kind's fields: `read` its text into `{name: value}` (what it can read; never raises on text it
    does not know), `keys` the fields it declares with their types, `open`: it reads the message's `key: value`
    pieces (`pairs`), keeping every other key it prints under its canonical name, and a value that reads as no number
    as printed (a line cut inside it)."""

    read: Callable[[str], dict[str, Value]]
    keys: Mapping[str, type | tuple[type, ...]]
    open: bool = False


_DIGITS = frozenset("0123456789%")
MAX_DIGITS = 30  # a longer run of digits is not a count any log prints: kept as text, never a number
_NON_WORD = re.compile(r"[^a-z0-9]+")
_EST = re.compile(r"\best\. ")  # SGLang's `est. decode TFLOPS/s (per GPU)`: one key, not two pieces

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
    # vLLM's stats and spec-decoding lines (docs/log-formats.md §9.2)
    "avg_prompt_throughput": "input_throughput",
    "avg_generation_throughput": "gen_throughput",
    "running": "running_req",
    "waiting": "queue_req",
    "pending": "queue_req",
    "swapped": "swapped_req",
    "deferred": "deferred_req",
    "prefix_cache_hit_rate": "cache_hit_rate",
    "mean_acceptance_length": "accept_len",
    "avg_draft_acceptance_rate": "accept_rate",
    "draft_acceptance_rate": "accept_rate",
}
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
        return int(v) if len(v) <= MAX_DIGITS else v
    if v == "True" or v == "False":
        return v == "True"
    if v == "None":
        return None
    percent = v.endswith("%")
    head = v[:-1] if percent else v.split(" ", 1)[0]
    if not head or head[-1] not in _DIGITS or len(head) > MAX_DIGITS:
        return v
    try:
        number: int | float = int(head) if head.lstrip("-").isdigit() else float(head)
    except ValueError:
        return v
    if isinstance(number, float) and not math.isfinite(number):
        return v
    return number / 100 if percent else number


def pairs(text: str) -> dict[str, Value]:
    """Every `key: value` / `key=value` piece of `text`, in canonical names."""
    out: dict[str, Value] = {}
    if "est. " in text:
        text = _EST.sub("est ", text)
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


_ASSIGN = re.compile(r"(?:self\.)?([A-Za-z_][\w.]{0,80}?)(?:\(\))?=(-?\d+(?:\.\d+)?)")


def assignments(text: str) -> dict[str, Value]:
    """Every `name=number` of `text` (`self.available_size()=12`: `available_size`), in canonical names."""
    return {canonical(k.rsplit(".", 1)[-1]): value(v) for k, v in _ASSIGN.findall(text)}


def message(text: str) -> dict[str, Value]:
    """A message read as its words alone."""
    return {"message": text.strip()}


PAIRS = Fields(pairs, {}, open=True)  # a message read as its `key: value` pieces alone
