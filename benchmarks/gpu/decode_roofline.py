"""Decode step time of a dummy-weight model at several batch sizes, against the memory-bandwidth roofline
(bench/gpu/roofline.py) with the bandwidth measured in the same run. Each step is one `ModelRunner.forward` of a
decode batch whose requests hold `--context` tokens each, synchronized, so launch overheads count as they do
in serving; with graphs captured, the same batch is also timed eagerly.

    python -m benchmarks.gpu.decode_roofline                 # llama-3.1-8b, bf16, batch 1/8/64/256, context 1024
    python -m benchmarks.gpu.decode_roofline --dry-run       # CPU, a tiny config, seconds: exercises the code only
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.common import provenance, slug, write_result
from benchmarks.gpu.roofline import decode_step_bytes, measure_copy_bandwidth, roofline_seconds, weight_bytes_read
from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs

MODULE = "benchmarks.gpu.decode_roofline"
TARGET_BATCH, TARGET_RATIO = 1, 1.25
# A config of the preset's architecture small enough for a CPU dry run, and a context and pool to match.
TINY_OVERRIDES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
DRY_RUN_SETTINGS = {"json_model_override_args": json.dumps(TINY_OVERRIDES), "context_length": 256,
                    "max_total_tokens": 8192}


@dataclass
class DecodeRow:
    batch: int
    context: int
    cuda_graph: bool  # whether the timed steps replayed a captured graph
    step_ms: float  # median wall time of one synchronized step
    eager_step_ms: float | None  # the same batch with graphs bypassed; None without graphs
    step_bytes: int
    roofline_ms: float
    ratio_to_roofline: float


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", help="a --load-format dummy preset")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--context", type=int, default=1024, help="tokens each request holds, the new one included")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help='extra ServerArgs as JSON, e.g. {"page_size": 16}')
    parser.add_argument("--out", type=Path, default=None, help="folder for the result JSON")
    parser.add_argument("--json-out", type=Path, default=None, help="write the record to exactly this file")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny config, batch 1/3, context 32")
    return parser


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    if opts.dry_run:
        opts.batch_sizes, opts.context, opts.warmup, opts.iters = [1, 3], 32, 1, 2
    device = torch.device("cpu" if opts.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{MODULE} needs a CUDA GPU; use --dry-run to exercise it on CPU")
    record = {"meta": provenance(MODULE, argv, device, dry_run=opts.dry_run), **run(opts, device)}
    print_table(record)
    if opts.out is not None:
        name = f"decode_roofline_{slug(record['meta']['device'])}"
        print(f"wrote {write_result(name, record, opts.out)}")
    if opts.json_out is not None:
        opts.json_out.write_text(json.dumps(record, indent=2) + "\n")
    return record


def server_args(opts: argparse.Namespace, device: torch.device) -> ServerArgs:
    max_bs = max(opts.batch_sizes)
    page_size = opts.engine_args.get("page_size", 1)
    settings = dict(
        model_path=opts.model, load_format="dummy", dtype=opts.dtype, device=device.type,
        attention_backend=opts.attention_backend, disable_cuda_graph=opts.disable_cuda_graph,
        cuda_graph_bs=sorted(opts.batch_sizes), max_running_requests=max_bs,
        max_total_tokens=max_bs * -(-opts.context // page_size) * page_size, log_level="warning",
    )
    if opts.dry_run:
        settings = {**settings, **DRY_RUN_SETTINGS}
    return ServerArgs(**{**settings, **opts.engine_args})  # NOTE: the runner resolves them against the model


def run(opts: argparse.Namespace, device: torch.device) -> dict:
    runner = ModelRunner(server_args(opts, device))
    bandwidth = measure_copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (1 << 24))
    dtype_bytes = torch.tensor([], dtype=runner.dtype).element_size()
    rows = [_measure(runner, bs, opts, bandwidth, dtype_bytes) for bs in opts.batch_sizes]
    target = next((r for r in rows if r.batch == TARGET_BATCH), None)
    return {
        "benchmark": "decode step vs the memory-bandwidth roofline",
        "model": opts.model,
        "dtype": opts.dtype,
        "attention_backend": runner.attention_backend_name,
        "captured_batch_sizes": runner.graph_runner.batch_sizes if runner.graph_runner else [],
        "measured_bandwidth_gbs": bandwidth / 1e9,
        "weight_bytes_read_per_step_bs1": weight_bytes_read(runner.config, dtype_bytes, 1),
        "rows": [asdict(r) for r in rows],
        "target": {
            "batch": TARGET_BATCH, "max_ratio_to_roofline": TARGET_RATIO,
            "met": None if opts.dry_run or target is None else target.ratio_to_roofline <= TARGET_RATIO,
        },
    }


def _measure(runner: ModelRunner, bs: int, opts, bandwidth: float, dtype_bytes: int) -> DecodeRow:
    batch, release = resident_decode_batch(runner, bs, opts.context)
    try:
        step = statistics.median(step_times(lambda: runner.forward(batch), runner.device, opts.warmup, opts.iters))
        used_graph = runner.forward(batch).used_cuda_graph
        eager = None
        if runner.graph_runner is not None:
            graphs, runner.graph_runner = runner.graph_runner, None
            try:
                eager = statistics.median(step_times(lambda: runner.forward(batch), runner.device, opts.warmup,
                                                     opts.iters))
            finally:
                runner.graph_runner = graphs
    finally:
        release()
    step_bytes = decode_step_bytes(runner.config, dtype_bytes, bs, opts.context)
    roofline = roofline_seconds(step_bytes, bandwidth)
    return DecodeRow(bs, opts.context, used_graph, step * 1e3, None if eager is None else eager * 1e3, step_bytes,
                     roofline * 1e3, step / roofline)


def resident_decode_batch(runner: ModelRunner, bs: int, context: int) -> tuple[ForwardBatch, Callable[[], None]]:
    """A decode batch of `bs` requests holding `context` tokens each (their K/V is whatever the pool holds), and
    the function that gives their rows and slots back."""
    table, allocator = runner.req_to_token_pool, runner.allocator
    rows = [table.alloc() for _ in range(bs)]
    slots = [allocator.alloc(context) for _ in range(bs)]
    if None in rows or any(s is None for s in slots):
        raise RuntimeError(f"the KV pool cannot hold {bs} requests of {context} tokens")
    for row, row_slots in zip(rows, slots):
        table.write(row, 0, row_slots)
    last = torch.stack(slots)[:, -1].contiguous()
    batch = ForwardBatch.build(ForwardMode.DECODE, rows, [context - 1] * bs, [[1]] * bs, last, table.req_to_token,
                               runner.kv_pool, runner.attn_backend)

    def release() -> None:
        for row in rows:
            table.free(row)
        allocator.free(torch.cat(slots))

    return batch, release


def step_times(step: Callable[[], object], device: torch.device, warmup: int, iters: int) -> list[float]:
    """Seconds of each of `iters` synchronized calls after `warmup` untimed ones."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def print_table(record: dict) -> None:
    meta = record["meta"]
    print(f"{record['benchmark']}: {record['model']} {record['dtype']} on {meta['device']}, "
          f"{record['attention_backend']}, measured bandwidth {record['measured_bandwidth_gbs']:.0f} GB/s")
    print(f"{'batch':>6}{'context':>9}{'graph':>7}{'step ms':>10}{'eager ms':>10}{'roofline ms':>13}{'ratio':>8}")
    for row in record["rows"]:
        eager = f"{row['eager_step_ms']:.3f}" if row["eager_step_ms"] is not None else "-"
        print(f"{row['batch']:>6}{row['context']:>9}{str(row['cuda_graph']):>7}{row['step_ms']:>10.3f}{eager:>10}"
              f"{row['roofline_ms']:>13.3f}{row['ratio_to_roofline']:>8.2f}")


if __name__ == "__main__":
    main()
