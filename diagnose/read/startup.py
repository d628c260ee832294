"""Start-up lines (docs/log-formats.md §5, §9.3-§9.4): SGLang's memory pool, weights, KV cache and CUDA-graph lines,
vLLM's capacity and memory lines; each kind's fields. Most print `key=value` pieces (read as they come); vLLM's have
readers of their own where their numbers carry thousands separators or units.
"""
from __future__ import annotations

import functools
import re

from toolkit.diagnose.read.values import PAIRS, Fields, Number, Value, assignments, pairs

_CAPPED = re.compile(r"max_total_tokens=(-?\d+) is larger than the profiled value (-?\d+)")


def _capped(text: str) -> dict[str, Value]:
    m = _CAPPED.search(text)
    return {"max_total_tokens": int(m.group(1)), "profiled": int(m.group(2))} if m else {}


_BATCH_SIZES = re.compile(r"\bbs=\[([\d, ]{1,4000})\]")  # 0.5's begin line lists them: `bs=[1, 2, 4, 8, ..., 32]`


def _graph(text: str) -> dict[str, Value]:
    """A capture's `key=value` pieces; `draft` for the draft model's graphs, `prefill` for prefill graphs, and
    `captured_bs`, the largest batch size of a whole list the begin line prints."""
    out = pairs(text)
    head = text[:60].lower()
    out["draft"], out["prefill"] = "draft" in head, "prefill" in head
    sizes = _BATCH_SIZES.search(text)
    if sizes is not None and any(x.strip() for x in sizes.group(1).split(",")):
        out["captured_bs"] = max(int(x) for x in sizes.group(1).split(",") if x.strip())
    return out


_AVAIL_MEM = re.compile(r"avail_mem=(\d{1,6}(?:\.\d{1,4})?) GB")


_CAPTURED_SIZE = re.compile(r"\((bs|num_tokens)=(\d{1,8}) ")


def _progress(text: str) -> dict[str, Value]:
    """`Capturing batches (bs=4 avail_mem=18.72 GB):  33%|...`: the memory free at the first bar of the line, and
    the size it captures (`bs`; piecewise graphs: `num_tokens`)."""
    m = _AVAIL_MEM.search(text)
    size = _CAPTURED_SIZE.search(text)
    return ({"avail_mem": float(m.group(1))} if m else {}) | ({size.group(1): int(size.group(2))} if size else {})


# -- vLLM (docs/log-formats.md §9) ----------------------------------------------------------------------

def _count(text: str) -> int:
    return int(text.replace(",", ""))


_KV_CAPACITY = re.compile(r"(?:(\w+)(?: \+ host)? )?KV cache size: ([\d,]{1,40}) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]{1,40}) tokens per request: ([\d.]{1,20})x")


def _kv_capacity(text: str) -> dict[str, Value]:
    out: dict[str, Value] = {}
    m = _KV_CAPACITY.search(text)
    if m is not None:
        out.update(device=(m.group(1) or "GPU").lower(), kv_tokens=_count(m.group(2)))
    out.update(_concurrency(text))
    return out


def _concurrency(text: str) -> dict[str, Value]:
    m = _CONCURRENCY.search(text)
    return {"max_model_len": _count(m.group(1)), "max_concurrency": float(m.group(2))} if m else {}


# vLLM with speculative decoding: `max_num_scheduled_tokens is set to 2048 based on the speculative decoding settings.`
# (the tokens a step schedules, what `max_num_batched_tokens` leaves after the draft tokens' slots)
_SCHEDULED = re.compile(r"max_num_scheduled_tokens is set to (\d{1,9})")


def _scheduler(text: str) -> dict[str, Value]:
    m = _SCHEDULED.search(text)
    return {"max_num_scheduled_tokens": int(m.group(1))} if m else assignments(text)


_BLOCKS = re.compile(r"# (\w{1,10}) blocks: (\d{1,20})(?:, # CPU blocks: (\d{1,20}))?")


def _gpu_blocks(text: str) -> dict[str, Value]:
    m = _BLOCKS.search(text)
    if m is None:
        return {}
    out: dict[str, Value] = {"device": m.group(1).lower(), "device_blocks": int(m.group(2))}
    if m.group(3) is not None:
        out["cpu_blocks"] = int(m.group(3))
    return out


_GIB = r"(-?[\d.]{1,20}) ?Gi?B"
_PROFILE = {
    "total_gpu_memory_gb": re.compile(r"total_gpu_memory(?: \(|=)" + _GIB),
    "gpu_memory_utilization": re.compile(r"gpu_memory_utilization(?: \(|=)([\d.]{1,10})"),
    "weights_gb": re.compile(r"model weights take " + _GIB),
    "non_torch_gb": re.compile(r"non_torch_memory takes " + _GIB),
    "activation_peak_gb": re.compile(r"activation peak memory takes " + _GIB),
    "kv_cache_gb": re.compile(r"(?:reserved for KV Cache is |kv_cache_size=)" + _GIB),
    "profile_seconds": re.compile(r"Memory profiling takes ([\d.]{1,20}) seconds"),
}
_MEMORY = {
    "kv_memory": {"kv_cache_gb": re.compile(r"Available KV cache memory: " + _GIB)},
    "weights_loaded": {"weights_gb": re.compile(r"took " + _GIB),
                       "load_seconds": re.compile(r"and ([\d.]{1,20}) seconds")},
    "graph_captured": {"elapsed": re.compile(r"finished in ([\d.]{1,20}) secs?"),
                       "graph_gb": re.compile(r", took " + _GIB)},
    "memory_profile": _PROFILE,
}


def _numbers(kind: str, text: str) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for key, pattern in _MEMORY[kind].items():
        m = pattern.search(text)
        if m is not None:
            try:
                out[key] = float(m.group(1))
            except ValueError:
                continue
    return out


_GRAPH = {"draft": bool, "prefill": bool, "captured_bs": int}
FIELDS: dict[str, Fields] = {
    kind: PAIRS for kind in ("pool", "load_begin", "load_end", "kv_alloc", "pool_end", "dist_init", "mm_profile")
} | {
    "tokens_capped": Fields(_capped, {"max_total_tokens": int, "profiled": int}),
    "graph_begin": Fields(_graph, _GRAPH, open=True),
    "graph_end": Fields(_graph, _GRAPH, open=True),
    "graph_progress": Fields(_progress, {"avail_mem": float, "bs": int, "num_tokens": int}),
    "kv_capacity": Fields(_kv_capacity, {"device": str, "kv_tokens": int, "max_model_len": int,
                                         "max_concurrency": float}),
    "max_concurrency": Fields(_concurrency, {"max_model_len": int, "max_concurrency": float}),
    "gpu_blocks": Fields(_gpu_blocks, {"device": str, "device_blocks": int, "cpu_blocks": int}),
    "scheduler_config": Fields(_scheduler, {"max_num_batched_tokens": Number, "max_num_scheduled_tokens": int},
                               open=True),
} | {kind: Fields(functools.partial(_numbers, kind), dict.fromkeys(numbers, float))
     for kind, numbers in _MEMORY.items()}
