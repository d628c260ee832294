"""`ServerArgs` → `ResolvedArgs`: the flags SGLang derives from the device, filled once (docs/scheduling.md §4).

Everything after the launch (model runner, scheduler, the `server_args=` log line) reads the resolved arguments.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from toolkit.runtime.memory.device import resolve_device, total_memory_mib
from toolkit.runtime.memory.planning import CPU_CHUNKED_PREFILL_SIZE, cuda_defaults, default_page_size
from toolkit.runtime.server_args import ResolvedArgs, ServerArgs


def with_device_defaults(args: ServerArgs) -> ResolvedArgs:
    """Fill the device's defaults; arguments already resolved pass through as they are."""
    if isinstance(args, ResolvedArgs):
        return args
    device = resolve_device(args.device)
    filled = _cuda_values(args, device) if device.type == "cuda" else _cpu_values(args)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    resolved = ResolvedArgs(**{**values, "page_size": args.page_size or default_page_size(device.type), **filled})
    _check_a_chunk_holds_a_page(resolved)
    return resolved


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
