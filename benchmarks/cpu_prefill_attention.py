"""Whether the native prefill-attention kernel pays on this CPU: whole prefills of the embedded model (new prompts,
nothing cached, radix cache off) with the kernel and with torch's SDPA per prompt, the two interleaved within every
repeat (order flipped each) so this VM's drift falls on both. Prints every repeat, the median and the spread of the
paired SDPA/kernel time ratio, per prompt shape.

    python -m benchmarks.cpu_prefill_attention [--dtype float32] [--shapes 16x256 4x1024] [--repeats 5] [--save]

`--save` writes benchmarks/results/cpu_prefill_attention_<dtype>_<isa>.json (every run kept, see `write_result`).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from unittest import mock

import torch

from benchmarks.common import provenance, random_requests, write_result
from toolkit.runtime import cpu_capability
from toolkit.runtime import kernels as cpu_kernels

MODULE = "benchmarks.cpu_prefill_attention"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--shapes", nargs="+", default=["16x256", "4x1024"], help="PROMPTSxTOKENS per prefill")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save", action="store_true")
    return parser


def _engine(dtype: str, prompts: int, tokens: int):
    from toolkit.runtime import Engine

    return Engine(dtype=dtype, device="cpu", log_level="warning", decode_log_interval=10**6,
                  max_running_requests=prompts, disable_radix_cache=True, disable_overlap_schedule=True,
                  chunked_prefill_size=prompts * tokens, max_prefill_tokens=prompts * tokens)


def _prefill_seconds(engine, prompts: int, tokens: int, seed: int) -> float:
    """Seconds to prefill `prompts` new prompts of `tokens` random tokens (one output token each)."""
    from toolkit.runtime.io_struct import GenerateInput
    from toolkit.runtime.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    vocab = engine.runner.config.vocab_size
    for i, request in enumerate(random_requests(prompts, tokens, 1, 1.0, vocab, seed=seed, special_ids=set())):
        engine.scheduler.add_request(GenerateInput(f"p{seed}-{i}", request.input_ids, params))
    start = time.perf_counter()
    while engine.scheduler.has_work:
        engine.scheduler.step()
    return time.perf_counter() - start


@contextlib.contextmanager
def _attention(native: bool) -> Iterator[list[bool]]:
    """The backend's choice forced: the kernel where it applies (native), else SDPA; yields its answers."""
    answers: list[bool] = []
    applies = cpu_kernels.prefill_attention_applies

    def forced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        answers.append(native and applies(q, k, v))
        return answers[-1]

    with mock.patch.object(cpu_kernels, "prefill_attention_applies", forced):
        yield answers


def measure(engine, prompts: int, tokens: int, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"sdpa": [], "kernel": []}
    _prefill_seconds(engine, prompts, tokens, seed=0)  # warm-up
    for repeat in range(repeats):
        for native in ([True, False] if repeat % 2 == 0 else [False, True]):
            with _attention(native) as answers:
                seconds = _prefill_seconds(engine, prompts, tokens, seed=1 + repeat)
            assert answers and all(answer == native for answer in answers), "every layer took the forced path"
            times["kernel" if native else "sdpa"].append(seconds * 1e3)
    return times


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    probe = cpu_capability.probe()
    dtype = getattr(torch, opts.dtype)
    if not cpu_kernels.prefill_attention_supported(dtype):
        raise SystemExit(f"the prefill kernel does not attend {opts.dtype} here ({probe.summary()})")
    print(probe.summary())
    print(f"{'prompts x tokens':>17}{'sdpa ms':>10}{'kernel ms':>11}{'ratio':>8}  [spread]   paired repeats")
    rows = []
    with torch.no_grad():
        for shape in opts.shapes:
            prompts, tokens = (int(part) for part in shape.split("x"))
            times = measure(_engine(opts.dtype, prompts, tokens), prompts, tokens, opts.repeats)
            paired = [sdpa / kernel for sdpa, kernel in zip(times["sdpa"], times["kernel"])]
            medians = {name: statistics.median(values) for name, values in times.items()}
            print(f"{shape:>17}{medians['sdpa']:>10.0f}{medians['kernel']:>11.0f}{statistics.median(paired):>7.2f}x"
                  f"  [{min(paired):.2f}-{max(paired):.2f}]   " + ", ".join(f"{r:.2f}" for r in paired))
            rows.append({"prompts": prompts, "tokens": tokens, "ms": times, "median_ms": medians,
                         "sdpa_over_kernel": paired, "sdpa_over_kernel_median": statistics.median(paired)})
    record = {"meta": provenance(MODULE, argv, "cpu"), "dtype": opts.dtype,
              "benchmark": "whole prefills of the embedded model: native prefill attention vs SDPA per prompt",
              "model": "SmolLM2-135M-Instruct (embedded)", "rows": rows}
    if opts.save:
        name = f"cpu_prefill_attention_{opts.dtype}_{probe.isa.replace('-', '_')}"
        print(f"wrote {write_result(name, record)}")
    return record


if __name__ == "__main__":
    main()
