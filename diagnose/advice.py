"""The corrected launch command: the server's own arguments, with every finding's typed change applied.

Only arguments that matter for tuning (and the model, parallelism and address) are written. A finding's change
and its companions are applied when they carry a value (a direction alone, or a knob named without a value,
changes nothing); its alternatives are offered in the advice, never applied. When two findings touch the same
flag, the more severe one (the earlier in the list) wins. SGLang's command starts
`python -m sglang.launch_server`, vLLM's `vllm serve MODEL` (its arguments from the engine config and the
`non-default args` line).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.ideas import flag_of
from toolkit.diagnose.read.launch import SGLANG_LAUNCHER, VLLM_LAUNCHER
from toolkit.diagnose.read.values import Value
from toolkit.runtime.server_args import ServerArgs  # torch-free: the flag declarations only

# The SGLang arguments a corrected command keeps, in order.
KEPT_NAMES: tuple[str, ...] = (
    "model_path", "tokenizer_path", "served_model_name", "host", "port", "tp_size", "dp_size", "dtype",
    "quantization", "kv_cache_dtype", "context_length", "mem_fraction_static", "max_running_requests",
    "max_queued_requests", "max_total_tokens", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
    "schedule_conservativeness", "page_size", "disable_radix_cache", "enable_mixed_chunk", "attention_backend",
    "disable_cuda_graph", "cuda_graph_max_bs", "enable_torch_compile", "torch_compile_max_bs", "enable_dp_attention",
)
# NOTE: the logs are SGLang's, so where its default is not ours the log source's wins: page_size (ours is filled
# from the device, SGLang's is 1), attention_backend (SGLang's None picks per device, ours spells it "auto"),
# schedule_policy (SGLang releases differ, lpm in older ones, fcfs in newer: always written), and
# enable_dp_attention (no flag of ours).
SGLANG_DEFAULTS: dict[str, Value] = {
    "page_size": 1, "attention_backend": None, "schedule_policy": None, "enable_dp_attention": False,
}


def _kept_args(names: tuple[str, ...]) -> tuple[tuple[str, Value], ...]:
    """(argument, value that needs no flag): SGLang's override, else our `ServerArgs` field's default."""
    ours = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    return tuple((name, SGLANG_DEFAULTS[name] if name in SGLANG_DEFAULTS else ours[name]) for name in names)


KEPT_ARGS: tuple[tuple[str, Value], ...] = _kept_args(KEPT_NAMES)
VLLM_KEPT_ARGS: tuple[tuple[str, Value], ...] = (
    ("host", None), ("port", 8000), ("tensor_parallel_size", 1), ("data_parallel_size", 1),
    ("quantization", None), ("kv_cache_dtype", "auto"), ("max_model_len", None),
    ("gpu_memory_utilization", None), ("max_num_seqs", None), ("max_num_batched_tokens", None),
    ("enable_prefix_caching", True), ("enforce_eager", False), ("max_cudagraph_capture_size", 512),
)


def _flag(arg: str) -> str:
    return "--" + arg.replace("_", "-")


def _arg(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def changes(findings: Iterable[Finding]) -> dict[str, Value]:
    """`{argument: new value}` from the findings' changes (True/False for switches); the first finding wins."""
    out: dict[str, Value] = {}
    for f in findings:
        if f.change is None:
            continue
        for change in (f.change, *f.change.companions):
            flag = flag_of(change.idea, f.engine)
            if flag is not None and change.value is not None:
                out.setdefault(_arg(flag), change.value)
    return out


def launch_command(config: ServerConfig, findings: Iterable[Finding]) -> str | None:
    """The launch command with the findings applied; None when the log had no server arguments."""
    args = config.args
    if not args:
        return None
    if config.vllm:
        model = args.get("model")
        launcher = f"{VLLM_LAUNCHER} {_quote(str(model))}" if model else VLLM_LAUNCHER
        return _command(args, findings, launcher, VLLM_KEPT_ARGS)
    return _command(args, findings, SGLANG_LAUNCHER, KEPT_ARGS)


def _command(args: Mapping[str, Value], findings: Iterable[Finding], launcher: str,
             kept: tuple[tuple[str, Value], ...]) -> str:
    new = changes(findings)
    merged = {k: args.get(k) for k, _ in kept}
    merged.update(new)
    parts = [launcher]
    for arg, default in kept:
        value = merged.get(arg)
        if value is None or value == default or (value is False and default is False):
            continue
        if value is True:
            parts.append(_flag(arg))
        elif value is not False:
            parts.append(f"{_flag(arg)} {_quote(str(value))}")
    for arg, value in new.items():
        if arg not in dict(kept) and value not in (None, False):
            parts.append(_flag(arg) if value is True else f"{_flag(arg)} {_quote(str(value))}")
    return " ".join(parts)


def _quote(value: str) -> str:
    plain = value and all(c.isalnum() or c in "_./:@=+-" for c in value)
    return value if plain else "'" + value.replace("'", "'\\''") + "'"
