"""SGLang's decode and prefill lines (docs/log-formats.md §2-§3, §8): labels, field keys, the binding usage.

`Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, ...`: after the label, an unordered
`key: value` list. The per-line parser reads any key; the fast path reads lines whose keys are all in `KEYS` and
sends the rest to it. vLLM's periodic lines (§9.2) are read here too: its stats line, V0's prefix cache line and
the spec-decoding metrics.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

from toolkit.diagnose.read.values import Fields, Number, Value, canonical, pairs

DECODE_LABEL = "Decode batch"
PREFILL_LABEL = "Prefill batch"
NEW_FILL_LABEL = "new fill batch"  # SGLang 0.1's prefill line
LABELS = (DECODE_LABEL, PREFILL_LABEL, NEW_FILL_LABEL)
LABEL_ENDS = ".,"  # a label ends in `.` (to 0.5.3) or `,` (from 0.5.5), or ` [iter]` before it
RUNNING = "#running-req"   # every decode line prints it; a prefill line too, except on a PD prefill server
QUEUE = "#queue-req"
ACCEPT_LENGTH = "accept len"  # speculative decoding's accepted tokens per step (decode lines)
MIXED = f"(mixed {RUNNING}: "  # 0.3's `Prefill batch(mixed #running-req: N).`

FieldType = Literal["count", "ratio", "rate", "bool"]

# Every key the fast path reads, as printed, with its type: `count` an integer, `ratio` a fraction (`12.50%`
# reads 0.125), `rate` a decimal, `bool` `True`/`False`. No key is a prefix of another.
KEYS: dict[str, FieldType] = {
    RUNNING: "count", "#running_req": "count", QUEUE: "count",
    "#token": "count", "#full token": "count", "#gpu token": "count",
    "token usage": "ratio", "full token usage": "ratio", "gpu token usage": "ratio",
    "swa token usage": "ratio", "#swa token": "count", "#cpu token": "count", "cpu token usage": "ratio",
    "mamba usage": "ratio", "mamba num": "count",
    "cuda graph": "bool", "npu graph": "bool", "cpu graph": "bool", "musa graph": "bool",
    "gen throughput (token/s)": "rate", "input throughput (token/s)": "rate",
    "#new-seq": "count", "#new-token": "count", "#cached-token": "count", "cache hit rate": "ratio",
    "#pending-token": "count", ACCEPT_LENGTH: "rate", "accept rate": "ratio", "pre-allocated usage": "ratio",
    "#retracted-req": "count", "#prealloc-req": "count", "#transfer-req": "count", "#inflight-req": "count",
    "#bootstrap-req": "count", "#optimistic-req": "count", "#unbootstrapped-req": "count",
    "#transferring-req": "count", "#replay-token": "count", "cap len": "rate", "block accept len": "rate",
    "#host-receive-req": "count", "waiting-image-req": "count",
    "#grammar-queue-req": "count",  # requests waiting for their grammar to compile (structured output)
}
# Per-pool usages (hybrid SWA / mamba models), canonical names: `token_usage` is their maximum, the binding one.
USAGES = ("token_usage", "swa_token_usage", "mamba_usage")
BINDING_USAGE = "token_usage"
ENGINE = r"Engine (\d{1,4}): |(\d{1,4}) Engines Aggregated: "  # vLLM's stats line, data-parallel: its engine
_ENGINE = re.compile(ENGINE)

# -- reading ----------------------------------------------------------------------------------------------------

_ITER = re.compile(r"\s*\[(\d+)\]")
_MIXED = re.compile(re.escape(MIXED) + r"(\d+)\)")


def _batch(text: str) -> dict[str, Value]:
    for label in LABELS:
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
    usages = [out[k] for k in USAGES if isinstance(out.get(k), (int, float))]
    if usages:
        out[BINDING_USAGE] = max(usages)
    return out


class EngineTag(NamedTuple):
    """vLLM's `Engine 001: ` (engine 1) or `4 Engines Aggregated: ` (engines 4) before a stats line."""

    aggregated: bool
    number: int
    end: int


def engine_tag(text: str) -> EngineTag | None:
    m = _ENGINE.match(text)
    if m is None:
        return None
    return EngineTag(m.group(1) is None, int(m.group(1) or m.group(2)), m.end())


_KV_USAGE = re.compile(r"^(\w+)_kv_cache_usage$")


def _stats(text: str) -> dict[str, Value]:
    """`Engine 000: Avg prompt throughput: ...`: the KV usage of the pool's device is `token_usage` (V0 also
    prints the CPU swap space's usage, kept as `cpu_kv_cache_usage`)."""
    out: dict[str, Value] = {}
    tag = engine_tag(text)
    if tag is not None:
        out["engines" if tag.aggregated else "engine"] = tag.number
        text = text[tag.end:]
    out.update(pairs(text))
    pool = pool_usage_field(out)
    if pool is not None:
        out["token_usage"] = out[pool]
    return out


def pool_usage_field(names: Iterable[str]) -> str | None:
    """Which of a stats line's fields is the usage of its KV pool (read as `token_usage`): a GPU's, else another
    device's than the CPU, else the CPU's; None where the line prints none."""
    devices = {found.group(1): name for name in names if (found := _KV_USAGE.match(name))}
    return devices.get("gpu") or next((name for dev, name in devices.items() if dev != "cpu"), None) \
        or devices.get("cpu")


def _after_label(text: str) -> dict[str, Value]:
    """`Label: key: value, ...` (spec-decoding metrics, V0's prefix cache line): the pieces after the label."""
    out = pairs(text.partition(": ")[2])
    if "gpu" in out:
        out["cache_hit_rate"] = out["gpu"]
    return out


_TYPES: dict[FieldType, type | tuple[type, ...]] = {"count": int, "ratio": Number, "rate": Number, "bool": bool}
# NOTE: open: a fork's or a future era's keys are kept too (the fast path sends a line with one to the per-line parser)
BATCH_FIELDS = {canonical(key): _TYPES[kind] for key, kind in KEYS.items()} | {
    "iter": int, "mixed_running_req": int, BINDING_USAGE: Number}
FIELDS: dict[str, Fields] = {kind: Fields(_batch, BATCH_FIELDS, open=True) for kind in ("decode", "prefill")} | {
    "stats": Fields(_stats, {"engine": int, "engines": int, "token_usage": Number}, open=True),
    "prefix_cache": Fields(_after_label, {"cache_hit_rate": Number}, open=True),
    "spec_metrics": Fields(_after_label, {}, open=True),
}
