"""Decode attention time vs batch size and context length, per attention backend, with the achieved memory
bandwidth as a fraction of the device's peak. Decode attention reads every cached K/V byte once per step, so
bandwidth is its roofline.

    python -m benchmarks.gpu.attention_microbench                 # CUDA: full sweep, JSON under bench/results/
    python -m benchmarks.gpu.attention_microbench --dry-run       # CPU: one tiny shape in Triton's interpreter
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from benchmarks.common import RESULTS, device_name, slug


@dataclass
class Row:
    backend: str
    batch: int
    context: int
    ms: float | None  # None when the shape did not fit (oom) or the backend failed
    gbs: float | None
    fraction_of_peak: float | None
    note: str = ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.attention_microbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--context-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--backends", nargs="+", default=["triton", "torch_native", "flashinfer"],
                        choices=["triton", "torch_native", "flashinfer"])
    parser.add_argument("--num-heads", type=int, default=32, help="query heads (default: Llama-3-8B's 32)")
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--max-pool-gib", type=float, default=32.0, help="skip shapes whose KV pool is larger")
    parser.add_argument("--peak-gbs", type=float, default=None, help="reference bandwidth in GB/s (default: a copy measured in this run)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/<device>.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU smoke run: one tiny shape through Triton's interpreter, no bandwidth claims")
    return parser


def main(argv: Sequence[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.dry_run:
        # NOTE: must precede the first triton import so the kernels are built for the interpreter.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.batch_sizes, args.context_lens, args.iters, args.warmup = [1, 3], [40], 1, 0
        args.num_heads, args.num_kv_heads, args.head_dim = 4, 2, 64
        args.backends = [b for b in args.backends if b != "flashinfer"]
    import torch

    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("attention_microbench needs a CUDA GPU; use --dry-run to smoke-test on CPU")
    peak, peak_source = _peak_bandwidth(args, device)
    rows = [row for backend in args.backends for row in _sweep(backend, args, device, peak)]
    report = {
        "benchmark": "decode attention over the paged KV pool",
        "device": device_name(device),
        "peak_gbs": peak, "peak_source": peak_source, "dry_run": args.dry_run,
        "shape": {"num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads, "head_dim": args.head_dim,
                  "dtype": args.dtype, "page_size": args.page_size},
        "torch": torch.__version__, "rows": [asdict(r) for r in rows],
    }
    _print_table(report)
    out = args.out or (None if args.dry_run else RESULTS / f"attention_microbench_{slug(report['device'])}.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
    return report


def _sweep(backend_name: str, args, device, peak: float | None) -> list[Row]:
    import torch

    from toolkit.runtime.attention.registry import create_backend

    try:
        backend = create_backend(backend_name, device)
    except RuntimeError as exc:  # e.g. flashinfer not installed: one row says why, the other backends go on
        return [Row(backend_name, 0, 0, None, None, None, str(exc))]
    rows = []
    for batch in args.batch_sizes:
        for context in args.context_lens:
            try:
                rows.append(_measure(backend, batch, context, args, device, peak))
            except torch.OutOfMemoryError:
                rows.append(Row(backend_name, batch, context, None, None, None, "oom"))
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _measure(backend, batch: int, context: int, args, device, peak: float | None) -> Row:
    import torch

    from toolkit.runtime.attention.base import AttentionLayer

    dtype = getattr(torch, args.dtype)
    element = torch.tensor([], dtype=dtype).element_size()
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * element
    if kv_bytes / 2**30 > args.max_pool_gib:
        return Row(backend.name, batch, context, None, None, None, f"pool > {args.max_pool_gib} GiB")
    batch_obj, q, k, v = _decode_batch(batch, context, args, dtype, device, backend)
    layer = AttentionLayer(0, args.num_heads, args.num_kv_heads, args.head_dim, args.head_dim**-0.5)
    seconds = _time(lambda: backend.forward_decode(q, k, v, layer, batch_obj), args, device)
    moved = kv_bytes + 2 * q.numel() * element  # every cached K/V byte once, plus q in and the output out
    gbs = moved / seconds / 1e9
    return Row(backend.name, batch, context, seconds * 1e3, gbs, gbs / peak if peak else None)


def _decode_batch(batch: int, context: int, args, dtype, device, backend):
    """`batch` requests of `context` tokens each (the last one new), their pages scattered over the pool."""
    import torch

    from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
    from toolkit.runtime.memory.kv_pool import KVPool

    ps = args.page_size
    pages_per_req = -(-context // ps)
    num_pages = batch * pages_per_req
    pool = KVPool(num_pages * ps, ps, 1, args.num_kv_heads, args.head_dim, dtype, device)
    for buffer in (pool.k_buffer[0], pool.v_buffer[0]):
        buffer.normal_()
    pages = (torch.randperm(num_pages, device=device) + 1).view(batch, pages_per_req)
    positions = torch.arange(context, device=device)
    slots = pages[:, positions // ps] * ps + positions % ps
    req_to_token = slots.to(torch.int32)
    new_slots = slots[:, -1].contiguous()
    batch_obj = ForwardBatch.build(ForwardMode.DECODE, list(range(batch)), [context - 1] * batch,
                                   [[0]] * batch, new_slots, req_to_token, pool, backend)
    q = torch.randn(batch, args.num_heads, args.head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, args.num_kv_heads, args.head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    return batch_obj, q, k, v


def _time(fn, args, device) -> float:
    """Mean seconds per call: CUDA events around `iters` back-to-back calls after `warmup` calls."""
    import torch

    for _ in range(args.warmup):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
        return (time.perf_counter() - start) / args.iters
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(args.iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / args.iters


def _peak_bandwidth(args, device) -> tuple[float | None, str]:
    """The bandwidth a row is compared with: measured in this run (a device-to-device copy), never typed in."""
    if args.peak_gbs:
        return args.peak_gbs, "--peak-gbs"
    if device.type != "cuda":
        return None, "n/a on CPU"
    from benchmarks.gpu.roofline import measure_copy_bandwidth

    return measure_copy_bandwidth(device) / 1e9, "measured device-to-device copy in this run"


def _print_table(report: dict) -> None:
    print(f"{report['benchmark']} on {report['device']} (peak {report['peak_gbs']} GB/s, {report['peak_source']})")
    print(f"{'backend':<14}{'batch':>6}{'context':>9}{'ms':>10}{'GB/s':>9}{'of peak':>9}  note")
    for row in report["rows"]:
        ms = f"{row['ms']:.3f}" if row["ms"] is not None else "-"
        gbs = f"{row['gbs']:.0f}" if row["gbs"] is not None else "-"
        frac = f"{row['fraction_of_peak']:.0%}" if row["fraction_of_peak"] is not None else "-"
        print(f"{row['backend']:<14}{row['batch']:>6}{row['context']:>9}{ms:>10}{gbs:>9}{frac:>9}  {row['note']}")


if __name__ == "__main__":
    main()
