"""Whether oneDNN-packed linear weights pay on this CPU: the embedded model's linear layers (every layer's own
weights, so they come from memory as in a real step) with the packed weight and with the plain kernel, at batch
sizes from decode's to a prefill chunk's, and whole decode steps of the model packed and unpacked. The two are
interleaved within every repeat (order flipped each) so this VM's drift falls on both. Prints every repeat, the
median and the spread of the paired plain/packed ratio.

    python -m benchmarks.cpu_packing [--dtype float32] [--rows 1 16 64 256 2048] [--step-batches 16 64] [--save]

`--save` writes benchmarks/results/cpu_packing_<dtype>_<isa>.json (every run kept beside it, see `write_result`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import provenance, write_result
from benchmarks.cpu_dtype import runner_for
from benchmarks.gpu.decode_roofline import resident_decode_batch, step_times
from toolkit.runtime import cpu_capability
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.models.layers import Linear

MODULE = "benchmarks.cpu_packing"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256, 2048],
                        help="batch rows for the linear layers alone")
    parser.add_argument("--step-batches", type=int, nargs="+", default=[16, 64], help="decode batches, whole steps")
    parser.add_argument("--context", type=int, default=256, help="tokens each decoding request holds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save", action="store_true")
    return parser


def _linears(runner: ModelRunner) -> list[Linear]:
    layers = [m for m in runner.model.modules() if isinstance(m, Linear)]
    if not layers or any(m.packed_weight is None for m in layers):
        raise SystemExit(f"the model's linear layers are not packed here ({cpu_capability.probe().summary()})")
    return layers


def _time_layers(layers: list[Linear], inputs: dict[int, torch.Tensor], packed: bool) -> float:
    """Seconds for one pass over every linear layer."""
    start = time.perf_counter()
    for layer in layers:
        x = inputs[layer.in_features]
        if packed:
            layer(x)
        else:
            F.linear(x, layer.weight, layer.bias)
    return time.perf_counter() - start


def measure_layers(layers: list[Linear], rows: int, dtype: torch.dtype, repeats: int) -> dict[str, list[float]]:
    inputs = {n: torch.randn(rows, n, dtype=dtype) for n in {layer.in_features for layer in layers}}
    times: dict[str, list[float]] = {"plain": [], "packed": []}
    _time_layers(layers, inputs, True), _time_layers(layers, inputs, False)  # warm-up
    for repeat in range(repeats):
        for packed in ([True, False] if repeat % 2 == 0 else [False, True]):
            times["packed" if packed else "plain"].append(_time_layers(layers, inputs, packed) * 1e3)
    return times


def measure_steps(runner: ModelRunner, layers: list[Linear], batch: int, context: int,
                  repeats: int) -> dict[str, list[float]]:
    packed_weights = [layer.packed_weight for layer in layers]
    packed_head = runner.model.packed_tied_head
    forward_batch, release = resident_decode_batch(runner, batch, context)

    def set_packed(on: bool) -> None:
        for layer, weight in zip(layers, packed_weights):
            layer.packed_weight = weight if on else None
        runner.model.packed_tied_head = packed_head if on else None

    times: dict[str, list[float]] = {"plain": [], "packed": []}
    try:
        for repeat in range(repeats):
            for packed in ([True, False] if repeat % 2 == 0 else [False, True]):
                set_packed(packed)
                step = step_times(lambda: runner.forward(forward_batch), runner.device, 1, 3)
                times["packed" if packed else "plain"].append(statistics.median(step) * 1e3)
    finally:
        set_packed(True)
        release()
    return times


def _row(what: str, size: int, times: dict[str, list[float]]) -> dict:
    paired = [plain / packed for plain, packed in zip(times["plain"], times["packed"])]
    row = {"what": what, "size": size, "ms": times, "median_ms": {k: statistics.median(v) for k, v in times.items()},
           "plain_over_packed": paired, "plain_over_packed_median": statistics.median(paired)}
    print(f"{what:>12}{size:>6}{row['median_ms']['plain']:>10.2f}{row['median_ms']['packed']:>10.2f}"
          f"{row['plain_over_packed_median']:>9.2f}x  [{min(paired):.2f}-{max(paired):.2f}]   "
          + ", ".join(f"{r:.2f}" for r in paired))
    return row


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    probe = cpu_capability.probe()
    dtype = getattr(torch, opts.dtype)
    runner = runner_for(opts.dtype, max(opts.step_batches, default=1), opts.context)
    layers = _linears(runner)
    print(probe.summary())
    print(f"{'':>12}{'rows':>6}{'plain ms':>10}{'packed ms':>10}{'ratio':>10}  [spread]   paired repeats")
    rows = []
    with torch.no_grad():
        for size in opts.rows:
            rows.append(_row("linears", size, measure_layers(layers, size, dtype, opts.repeats)))
        for batch in opts.step_batches:
            rows.append(_row("decode step", batch, measure_steps(runner, layers, batch, opts.context, opts.repeats)))
    record = {"meta": provenance(MODULE, argv, "cpu"), "dtype": opts.dtype,
              "benchmark": "linear layers and decode steps of the embedded model, oneDNN-packed vs plain weights",
              "model": "SmolLM2-135M-Instruct (embedded)", "context": opts.context, "rows": rows}
    if opts.save:
        name = f"cpu_packing_{opts.dtype}_{probe.isa.replace('-', '_')}"
        print(f"wrote {write_result(name, record)}")
    return record


if __name__ == "__main__":
    main()
