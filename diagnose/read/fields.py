"""Field reading: an event's message -> `{canonical_name: value}`.

Fields are read as an unordered `key: value` (or `key=value`) list; unknown keys are kept under their
canonical name and never required, so forks and future eras parse without a template (docs/log-formats.md §8).
vLLM's messages (§9) have readers of their own where their numbers carry thousands separators or units.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
import shlex
from collections.abc import Iterable
from typing import Union

from toolkit.diagnose.read.batch import BINDING_USAGE, LABELS, MIXED, USAGES
from toolkit.diagnose.read.launch import PROGRAM_AT, SHELL_OPERATORS, VLLM_LAUNCHER, VLLM_SHORT_FLAGS
from toolkit.diagnose.read.messages import ACCESS_FIELDS, VLLM_FREE_MEMORY, engine_tag
from toolkit.diagnose.read.prefix import PASTE_QUOTE

Value = Union[int, float, bool, str, None]

_DIGITS = frozenset("0123456789%")
MAX_DIGITS = 30  # a longer run of digits is not a count any log prints: kept as text, never a number
_ITER = re.compile(r"\s*\[(\d+)\]")
_MIXED = re.compile(re.escape(MIXED) + r"(\d+)\)")
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


_ACCESS = re.compile(ACCESS_FIELDS)


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


def _message(text: str) -> dict[str, Value]:
    return {"message": text.strip()}


# vLLM's start-up refusal (`VLLM_FREE_MEMORY`): another process holds GPU memory, or the utilization asks for more
# than the device has free
_FREE_ON_DEVICE = re.compile(VLLM_FREE_MEMORY + r"([\d.]{1,12})/([\d.]{1,12}) GiB\) on startup is less than "
                             r"desired GPU memory utilization \(([\d.]{1,12}), ([\d.]{1,12}) GiB\)")


def _not_enough_memory(text: str) -> dict[str, Value]:
    out: dict[str, Value] = {"message": text.strip()}
    m = _FREE_ON_DEVICE.search(text)
    if m is not None:
        for name, number in zip(("free_gb", "total_gpu_memory_gb", "gpu_memory_utilization", "asked_gb"), m.groups()):
            out[name] = value(number)
    return out


_AVAIL_MEM = re.compile(r"avail_mem=(\d{1,6}(?:\.\d{1,4})?) GB")


_CAPTURED_SIZE = re.compile(r"\((bs|num_tokens)=(\d{1,8}) ")


def _progress(text: str) -> dict[str, Value]:
    """`Capturing batches (bs=4 avail_mem=18.72 GB):  33%|...`: the memory free at the first bar of the line, and
    the size it captures (`bs`; piecewise graphs: `num_tokens`)."""
    m = _AVAIL_MEM.search(text)
    size = _CAPTURED_SIZE.search(text)
    return ({"avail_mem": float(m.group(1))} if m else {}) | ({size.group(1): int(size.group(2))} if size else {})


# -- load shedding and clients giving up (docs/log-formats.md §6.4) -----------------------------------

_SHED = re.compile(r"Shed (\d{1,20}) requests? (?:in the last (\d{1,20}) s )?\(503, Retry-After (\d{1,10}) s\): ?(.*)")
_QUEUE_TIMEOUT = re.compile(r"Queue timeout: aborted (\d{1,20}) requests? that waited more than ([\d.]{1,20}) s"
                            r"(?:, #queue-req: (\d{1,20}))?")
_CLIENT_OF = re.compile(r"the client of ([A-Z]{1,10}) (\S{1,2000}) disconnected")


def _shed(text: str) -> dict[str, Value]:
    """`shed` (requests refused since the last line), `seconds` since it (absent on the first), `retry_after`,
    and the count per reason (`queue_full`, `waiting_timeout`)."""
    m = _SHED.match(text)
    if m is None:
        return {}
    out: dict[str, Value] = {"shed": int(m.group(1)), "retry_after": int(m.group(3))}
    if m.group(2) is not None:
        out["seconds"] = int(m.group(2))
    out.update({k: v for k, v in pairs(m.group(4)).items() if isinstance(v, int)})
    return out


_INPUT_TOO_LONG = re.compile(r"Input length \((\d+)(?: tokens)?\) exceeds the maximum allowed length \((\d+)")


def _input_too_long(text: str) -> dict[str, Value]:
    m = _INPUT_TOO_LONG.match(text)
    return {"input_len": int(m.group(1)), "max_input_len": int(m.group(2))} if m else {}


def _queue_timeout(text: str) -> dict[str, Value]:
    m = _QUEUE_TIMEOUT.match(text)
    if m is None:
        return {}
    out: dict[str, Value] = {"aborted": int(m.group(1)), "waited_s": value(m.group(2))}
    if m.group(3) is not None:
        out["queue_req"] = int(m.group(3))
    return out


def _client_gone(text: str) -> dict[str, Value]:
    m = _CLIENT_OF.match(text)
    return {"method": m.group(1), "path": m.group(2)} if m else _message(text)


_TRANSFER = re.compile(r"(Prefill|Decode) transfer failed for request (?:rank=(\d+) )?(?:.*?rid='([^']*)')?.*?"
                       r"(?: with exception (?:\w+\([^()]*\): )?(.*))?$")


def _transfer_failed(text: str) -> dict[str, Value]:
    """`Prefill transfer failed for request rank=4 req.rid='ab' req.bootstrap_room=9 with exception
    KVTransferError(bootstrap_room=9): Decode instance could be dead, ...`: the side, rank, request and why."""
    m = _TRANSFER.match(text)
    if m is None:
        return {}
    side, rank, rid, reason = m.groups()
    out: dict[str, Value] = {"side": side.lower()}
    if rank is not None:
        out["transfer_rank"] = int(rank)
    if rid is not None:
        out["rid"] = rid
    if reason:
        out["reason"] = reason.strip()
    return out


# -- vLLM (docs/log-formats.md §9) ----------------------------------------------------------------------

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


_PREEMPT = re.compile(r"Sequence group (\S{1,200}) is preempted (?:by|in) (?:PreemptionMode\.)?(\w{1,20}) mode")
_RESUMED = re.compile(r"Preempted request (\S{1,200}) has been resumed")
_CUMULATIVE = re.compile(r"total_(?:num_)?cumulative_preemption(?:_cnt)?=(\d{1,20})")


def _preempt(text: str) -> dict[str, Value]:
    out: dict[str, Value] = {}
    m = _PREEMPT.search(text)
    if m is not None:
        out.update(request=m.group(1), mode=m.group(2).lower())
    resumed = _RESUMED.search(text)
    if resumed is not None:
        out.update(request=resumed.group(1), resumed=True)
    c = _CUMULATIVE.search(text)
    if c is not None:
        out["cumulative_preemptions"] = int(c.group(1))
    return out


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
        key, sep, raw = item.partition("=")
        if sep and key.strip().isidentifier():
            out[key.strip()] = _literal(raw.strip())
    size = _CAPTURE_SIZE.search(body)
    sizes = _CAPTURE_SIZES.search(body)
    if size is not None:
        out["max_cudagraph_capture_size"] = int(size.group(1))
    elif sizes is not None and sizes.group(1).strip():
        out["max_cudagraph_capture_size"] = max(int(x) for x in sizes.group(1).split(",") if x.strip())
    return out


def _engine_args(text: str) -> dict[str, Value]:
    return parse_server_args(text.partition("non-default args: ")[2])


MAX_COMMAND_CHARS = 16384  # a command is read this far (a quoted template may run on; tokens cost per character)
_QUOTE_MARGIN = re.compile(r"\s*" + PASTE_QUOTE)  # a continuation line's markdown quote or bash's prompt (PS2)
_NUMBER = re.compile(r"-\d[\d.]*(?:e[-+]?\d+)?")  # a negative number is a value, not a flag


def _launch_command(text: str) -> dict[str, Value]:
    """`launch_engine` (the engine its program names) and each flag by its argument name (`--tp 2` -> `tp_size`
    for SGLang), up to the end of the inline code it may be in, a shell operator or a comment: `--name value`,
    `--name=value`, a bare `--name` (True); `vllm serve MODEL`'s model."""
    first, *more = text[:MAX_COMMAND_CHARS].split("\n")
    command = " ".join([first.rstrip().rstrip("\\"),
                        *(_QUOTE_MARGIN.sub("", line, count=1).rstrip().rstrip("\\") for line in more)])
    command = command.partition("`")[0]
    engine, program = next(((e, m) for e, p in PROGRAM_AT.items() if (m := p.match(command))), (None, None))
    if program is None:
        return {}
    words = _shell_words(command[program.end():])
    out: dict[str, Value] = {"launch_engine": engine}
    if (program.group(0).endswith(VLLM_LAUNCHER) and words and re.match(r"[\w./~]", words[0])  # NOTE: no `…`
            and ("/" in words[0] or len(words) == 1 or words[1].startswith("-"))):
        out["model"] = words.pop(0)
    aliases = _aliases(engine)
    for i, word in enumerate(words):
        if not word.startswith("-") or word == "-" or _NUMBER.fullmatch(word):
            continue
        name, sep, raw = word.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if not name.isidentifier():
            continue
        if not sep:
            following = words[i + 1] if i + 1 < len(words) else None
            raw = following if following is not None and (not following.startswith("-")
                                                          or _NUMBER.fullmatch(following)) else "True"
        out[aliases.get(name, name)] = value(raw)
    return out


def _shell_words(text: str) -> list[str]:
    """The words of a shell command up to its first operator or comment (`--x 1 2>&1 | tee` -> `--x`, `1`)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: a paste cut inside the command
        words = text.partition("#")[0].split()
    for i, word in enumerate(words):
        if set(word) <= SHELL_OPERATORS:
            return words[: i - 1] if i and words[i - 1] in ("1", "2") and word[0] in "<>" else words[:i]
    return words


@functools.lru_cache(maxsize=2)
def _aliases(engine: str) -> dict[str, str]:
    """{flag name: argument}: SGLang's aliases as `ServerArgs` declares them (its flags are SGLang's; argparse also
    takes `--model` for `--model-path`), vLLM's short flags."""
    if engine == "vllm":
        return VLLM_SHORT_FLAGS
    from toolkit.runtime.server_args import FLAG, ServerArgs  # torch-free: the flag declarations only

    out = {"model": "model_path"}
    for f in dataclasses.fields(ServerArgs):
        for alias in f.metadata[FLAG].aliases if FLAG in f.metadata else ():
            out[alias.lstrip("-").replace("-", "_")] = f.name
    return out


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
    "graph_progress": _progress,
    "not_enough_memory": _not_enough_memory,
    "sigquit": _message,
    "shed": _shed,
    "queue_timeout": _queue_timeout,
    "input_too_long": _input_too_long,
    "client_gone": _client_gone,
    "kv_transfer_failed": _transfer_failed,
    "stats": _stats,
    "prefix_cache": _after_label,
    "spec_metrics": _after_label,
    "preempt": _preempt,
    "kv_capacity": _kv_capacity,
    "max_concurrency": _concurrency,
    "gpu_blocks": _gpu_blocks,
    "kv_memory": lambda text: _numbers("kv_memory", text),
    "memory_profile": lambda text: _numbers("memory_profile", text),
    "weights_loaded": lambda text: _numbers("weights_loaded", text),
    "graph_captured": lambda text: _numbers("graph_captured", text),
    "engine_config": _engine_config,
    "engine_args": _engine_args,
    "scheduler_config": _assignments,
    "launch_command": _launch_command,
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
