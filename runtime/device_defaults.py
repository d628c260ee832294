"""`ServerArgs` → `ResolvedArgs`: the flags SGLang derives from the device, filled once (docs/scheduling.md §4), and
every `auto` the device and the model decide (dtype, quantization, attention backend, page size), resolved here and
nowhere else.

Everything after the launch (model runner, scheduler, the `server_args=` log line, /get_server_info) reads the
resolved arguments.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from toolkit.runtime import cpu_capability
from toolkit.runtime.attention.registry import resolve_backend_name
from toolkit.runtime.memory.device import resolve_device, total_memory_mib
from toolkit.runtime.memory.planning import CPU_CHUNKED_PREFILL_SIZE, cuda_defaults, default_page_size
from toolkit.runtime.model_loader.config import ModelConfig
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.server_args import ResolvedArgs, ServerArgs

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED_QUANT_METHODS = ("fp8",)


def with_device_defaults(args: ServerArgs, config: ModelConfig) -> ResolvedArgs:
    """Fill the device's defaults and resolve the `auto`s against the device and the model's `config`; arguments
    already resolved pass through as they are."""
    if isinstance(args, ResolvedArgs):
        return args
    device = resolve_device(args.device)
    filled = _cuda_values(args, device) if device.type == "cuda" else _cpu_values(args)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    resolved = ResolvedArgs(**{
        **values,
        "dtype": resolve_dtype(args.dtype, config, device),
        "quantization": resolve_quantization(args.quantization, config),
        "attention_backend": resolve_backend_name(args.attention_backend, device),
        "page_size": args.page_size or default_page_size(device.type),
        **filled,
    })
    _check_a_chunk_holds_a_page(resolved)
    return resolved


def resolve_dtype(name: str, config: ModelConfig, device: torch.device) -> str:
    """`--dtype`: auto is the checkpoint's float32, else on CUDA its float16 or bfloat16; on a CPU bfloat16 only
    where oneDNN multiplies it natively (`cpu_capability`), float32 elsewhere."""
    if name != "auto":
        return name
    if config.torch_dtype in ("float32", "torch.float32"):
        return "float32"
    if device.type == "cpu":
        return str(cpu_capability.probe().auto_dtype()).removeprefix("torch.")
    if config.torch_dtype in ("float16", "torch.float16"):
        return "float16"
    return "bfloat16"


def resolve_quantization(flag: str | None, config: ModelConfig) -> str | None:
    """`--quantization`, or the checkpoint's own `quantization_config.quant_method` (as SGLang reads it)."""
    quant_config = config.extra.get("quantization_config") or {}
    method = quant_config.get("quant_method")
    if method is not None and method not in SUPPORTED_QUANT_METHODS:
        raise ModelLoadError(f"the checkpoint's quantization_config.quant_method {method!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_QUANT_METHODS)}")
    if quant_config.get("weight_block_size"):
        raise ModelLoadError(f"block-wise fp8 checkpoints (weight_block_size={quant_config['weight_block_size']}) "
                             "are not supported; per-tensor or per-channel weight_scale only")
    if flag is not None and method is not None and flag != method:
        raise ModelLoadError(f"--quantization {flag} does not match the checkpoint's quant_method {method!r}")
    return flag or method


def _check_a_chunk_holds_a_page(args: ResolvedArgs) -> None:
    """A prefill chunk is cut at a page boundary, so a chunk smaller than a page would admit nothing, ever."""
    if args.chunked_prefill_enabled and args.chunked_prefill_size < args.page_size:
        raise ValueError(f"--chunked-prefill-size {args.chunked_prefill_size} is smaller than a KV page "
                         f"({args.page_size} tokens on {args.device}, --page-size): no prompt could ever be "
                         f"admitted; use at least {args.page_size}, or -1 to disable chunking")


def _cpu_values(args: ServerArgs) -> dict[str, Any]:
    if args.base_gpu_id:
        raise ValueError(f"--base-gpu-id {args.base_gpu_id}: the device is cpu; GPU ids need CUDA")
    # NOTE: overlap off on a CPU: the host's work in a second thread takes a core from the forward's OpenMP
    # team, whose every op then waits at its barrier (measured: benchmarks/results/vs_vllm_cpu.json).
    return {
        "device": "cpu",
        "chunked_prefill_size": args.chunked_prefill_size or CPU_CHUNKED_PREFILL_SIZE,
        "disable_cuda_graph": True,
        "disable_overlap_schedule": args.disable_overlap_schedule is not False,
    }


def _cuda_values(args: ServerArgs, device: torch.device) -> dict[str, Any]:
    defaults = cuda_defaults(total_memory_mib(device), args.tp_size)
    return {
        "device": "cuda",
        "chunked_prefill_size": args.chunked_prefill_size or defaults.chunked_prefill_size,
        "cuda_graph_max_bs": args.cuda_graph_max_bs or defaults.cuda_graph_max_bs,
        "mem_fraction_static": args.mem_fraction_static or defaults.mem_fraction_static,
        "disable_overlap_schedule": bool(args.disable_overlap_schedule),
    }
