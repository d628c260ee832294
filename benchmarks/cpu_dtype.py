"""Which dtype `--dtype auto` should pick on this CPU: one decode step of the embedded model in float32 and in
bfloat16 (each as the runtime runs it here: bf16 packed by oneDNN where it multiplies bf16 natively, unpacked
elsewhere), at several batch sizes, the two dtypes interleaved within every repeat so this VM's drift falls on
both. Prints every repeat, the median and the spread of each, and bf16's time over float32's.

    python -m benchmarks.cpu_dtype [--batch-sizes 1 16 64] [--context 256] [--repeats 5] [--save]
    ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.cpu_dtype --save     # as an AVX2 machine runs it

`--save` writes benchmarks/results/cpu_dtype_<isa>.json (every run kept beside it, see `write_result`).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.common import provenance, write_result
from benchmarks.gpu.decode_roofline import resident_decode_batch, step_times
from toolkit.runtime import cpu_capability
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs

MODULE = "benchmarks.cpu_dtype"
DTYPES = ("float32", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, default=256, help="tokens each request holds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5, help="timed steps per repeat (their median is the repeat)")
    parser.add_argument("--save", action="store_true")
    return parser


def runner_for(dtype: str, max_batch: int, context: int) -> ModelRunner:
    pages = -(-context // 16) * 16
    return ModelRunner(ServerArgs(dtype=dtype, device="cpu", max_total_tokens=max_batch * pages + 64,
                                  max_running_requests=max_batch, log_level="warning"))


def measure(runners: dict[str, ModelRunner], batch: int, opts: argparse.Namespace) -> dict[str, list[float]]:
    """Per dtype, each repeat's median step in ms; the dtypes alternate within a repeat (order flipped each)."""
    prepared = {dtype: resident_decode_batch(runner, batch, opts.context) for dtype, runner in runners.items()}
    times: dict[str, list[float]] = {dtype: [] for dtype in runners}
    try:
        for repeat in range(opts.repeats):
            order = list(runners) if repeat % 2 == 0 else list(reversed(runners))
            for dtype in order:
                runner, (batch_obj, _) = runners[dtype], prepared[dtype]
                step = step_times(lambda: runner.forward(batch_obj), runner.device, 1, opts.iters)
                times[dtype].append(statistics.median(step) * 1e3)
    finally:
        for _, release in prepared.values():
            release()
    return times


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    probe = cpu_capability.probe()
    runners = {dtype: runner_for(dtype, max(opts.batch_sizes), opts.context) for dtype in DTYPES}
    rows = []
    print(probe.summary())
    print(f"{'batch':>6}{'dtype':>10}{'median ms':>11}{'min':>8}{'max':>8}   repeats (ms)")
    with torch.no_grad():
        for batch in opts.batch_sizes:
            times = measure(runners, batch, opts)
            medians = {dtype: statistics.median(values) for dtype, values in times.items()}
            for dtype, values in times.items():
                print(f"{batch:>6}{dtype:>10}{medians[dtype]:>11.2f}{min(values):>8.2f}{max(values):>8.2f}   "
                      + ", ".join(f"{v:.2f}" for v in values))
            paired = [b / f for f, b in zip(times["float32"], times["bfloat16"])]
            print(f"{'':>6}{'bf16/fp32':>10}{statistics.median(paired):>11.2f}{min(paired):>8.2f}{max(paired):>8.2f}")
            rows.append({"batch": batch, "context": opts.context, "step_ms": times, "median_ms": medians,
                         "bf16_over_fp32_paired": paired, "bf16_over_fp32_median": statistics.median(paired)})
    faster = "bfloat16" if all(r["bf16_over_fp32_median"] < 1.0 for r in rows) else "float32"
    record = {"meta": provenance(MODULE, argv, "cpu"), "benchmark": "decode step, float32 vs bfloat16, this CPU",
              "model": "SmolLM2-135M-Instruct (embedded)", "rows": rows, "faster_at_every_batch": faster,
              "auto_dtype": str(probe.auto_dtype()).removeprefix("torch.")}
    print(f"faster at every batch size: {faster}; --dtype auto picks {record['auto_dtype']} here")
    if opts.save:
        print(f"wrote {write_result(f'cpu_dtype_{probe.isa.replace(chr(45), chr(95))}', record)}")
    return record


if __name__ == "__main__":
    main()
