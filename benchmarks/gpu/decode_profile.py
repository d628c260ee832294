"""Where one decode step's GPU time goes: the kernels of `--iters` steps of a dummy-weight model at one batch size,
under torch.profiler (CUPTI records each kernel of a replayed CUDA graph too), summed by kernel and by kind
(GEMM, attention, norm, rotary, activation, sampling/logits, copy, other), against the step's memory roofline.

    python -m benchmarks.gpu.decode_profile                 # llama-3.1-8b, bf16, batch 1, context 1024
    python -m benchmarks.gpu.decode_profile --dry-run       # CPU, a tiny config: exercises the code only
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import provenance, slug, write_result
from benchmarks.gpu.decode_roofline import resident_decode_batch, server_args, step_times
from benchmarks.gpu.roofline import decode_step_bytes, measure_copy_bandwidth, roofline_seconds
from toolkit.runtime.model_runner import ModelRunner

MODULE = "benchmarks.gpu.decode_profile"
KINDS = (  # first match wins: (kind, substrings of the kernel name, lower case)
    ("gemm", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "matmul", "cublas")),
    ("attention", ("attn", "attention", "decode_kernel", "fwd_kernel", "flash")),
    ("norm", ("norm",)),
    ("rotary", ("rotary", "rope")),
    ("activation", ("silu", "act_and_mul", "gelu")),
    ("logits/sampling", ("argmax", "softmax", "topk", "sort", "max", "log_softmax")),
    ("copy/cast", ("copy", "cast", "fill", "index", "scatter", "gather", "cat")),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", help="a --load-format dummy preset")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--top", type=int, default=15, help="kernels listed by time")
    parser.add_argument("--engine-args", type=json.loads, default={})
    parser.add_argument("--out", type=Path, default=None, help="folder for the result JSON")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny config, context 32")
    return parser


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, marks in KINDS if any(m in name for m in marks)), "other")


def kernel_times(prof: profile, steps: int) -> dict[str, float]:
    """Microseconds per step of each kernel name (device-side events only)."""
    per_kernel: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name] += event.device_time / steps
    return dict(per_kernel)


def run(opts: argparse.Namespace, device: torch.device) -> dict:
    opts.batch_sizes = [opts.batch_size]  # what decode_roofline.server_args sizes the pool and graphs for
    runner = ModelRunner(server_args(opts, device))
    bandwidth = measure_copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (1 << 24))
    dtype_bytes = torch.tensor([], dtype=runner.dtype).element_size()
    batch, release = resident_decode_batch(runner, opts.batch_size, opts.context)
    try:
        wall = step_times(lambda: runner.forward(batch), device, 5, opts.iters)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(opts.iters):
                runner.forward(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        used_graph = runner.forward(batch).used_cuda_graph
    finally:
        release()
    kernels = kernel_times(prof, opts.iters)
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in kernels.items():
        by_kind[kind_of(name)] += us
    step_bytes = decode_step_bytes(runner.config, dtype_bytes, opts.batch_size, opts.context)
    top = sorted(kernels.items(), key=lambda item: -item[1])[:opts.top]
    return {
        "benchmark": "decode step kernel profile",
        "model": opts.model, "dtype": opts.dtype, "batch": opts.batch_size, "context": opts.context,
        "attention_backend": runner.attention_backend_name, "cuda_graph": used_graph,
        "step_ms_median": sorted(wall)[len(wall) // 2] * 1e3,
        "kernel_ms_per_step": sum(kernels.values()) / 1e3,
        "kernels_per_step": sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        / opts.iters,
        "roofline_ms": roofline_seconds(step_bytes, bandwidth) * 1e3,
        "measured_bandwidth_gbs": bandwidth / 1e9,
        "by_kind_ms": {kind: us / 1e3 for kind, us in sorted(by_kind.items(), key=lambda item: -item[1])},
        "top_kernels": [{"name": name[:160], "kind": kind_of(name), "ms": us / 1e3} for name, us in top],
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    if opts.dry_run:
        opts.context, opts.iters = 32, 2
    device = torch.device("cpu" if opts.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{MODULE} needs a CUDA GPU; use --dry-run to exercise it on CPU")
    record = {"meta": provenance(MODULE, argv, device, dry_run=opts.dry_run), **run(opts, device)}
    print(f"{record['model']} batch {record['batch']} context {record['context']} on {record['meta']['device']}: "
          f"step {record['step_ms_median']:.3f} ms (graph {record['cuda_graph']}), kernels "
          f"{record['kernel_ms_per_step']:.3f} ms in {record['kernels_per_step']:.0f} launches, roofline "
          f"{record['roofline_ms']:.3f} ms")
    for kind, ms in record["by_kind_ms"].items():
        print(f"  {kind:<16}{ms:>9.3f} ms")
    for row in record["top_kernels"]:
        print(f"  {row['ms']:>9.3f} ms  {row['kind']:<16}{row['name'][:100]}")
    if opts.out is not None:
        name = f"decode_profile_{slug(record['meta']['device'])}"
        print(f"wrote {write_result(name, record, opts.out)}")
    return record


if __name__ == "__main__":
    main()
