"""Where the time of a step goes: a decode step at batch 64 and 256 and a 64 x 256-token prefill on the embedded
model (bf16), broken down per op (torch profiler, self CPU time) and per Python function (cProfile), with the
steps run synchronously (overlap off) so both profilers see the forward.

    python -m benchmarks.profile_step [--label after] [--batch-sizes 64 256] [--context 256] [--save]

Each decode batch is built by admitting N prompts of `--context` random tokens (radix cache off) and running them
to decode; the profile covers `--steps` decode steps after warm-up. `--save` writes
benchmarks/results/profile_step_<label>.json.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from typing import Any

import torch

from benchmarks.common import device_name, provenance, random_requests, write_result

TOP_OPS = 15
TOP_FUNCTIONS = 15


def _engine(max_running: int):
    from toolkit.runtime import Engine

    return Engine(log_level="warning", decode_log_interval=10**6, max_running_requests=max_running,
                  disable_radix_cache=True, device="cpu", disable_overlap_schedule=True)


def _admit(engine, batch_size: int, context: int, max_new: int) -> None:
    from toolkit.runtime.io_struct import GenerateInput
    from toolkit.runtime.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    vocab = engine.runner.config.vocab_size
    for i, request in enumerate(random_requests(batch_size, context, max_new, 1.0, vocab, seed=1000 + batch_size,
                                                special_ids=set())):
        engine.scheduler.add_request(GenerateInput(f"r{i}", request.input_ids, params))


def _op_table(prof) -> list[dict[str, Any]]:
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total,
             "calls": e.count} for e in events[:TOP_OPS]]


def _function_table(profile: cProfile.Profile, steps: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(profile).stats
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP_FUNCTIONS]
    return [{"function": f"{path.split('/toolkit/')[-1].split('/work/main/')[-1]}:{line}({name})",
             "self_ms_per_step": tottime / steps * 1e3, "calls_per_step": calls / steps}
            for (path, line, name), (_, calls, tottime, _, _) in rows]


def profile(run_steps, steps: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    start = time.perf_counter()
    run_steps(steps)
    wall = (time.perf_counter() - start) / steps
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(steps)
    python = cProfile.Profile()
    python.enable()
    run_steps(steps)
    python.disable()
    return {"step_ms": wall * 1e3, "top_ops": _op_table(prof), "top_python": _function_table(python, steps)}


def decode_profile(batch_size: int, context: int, steps: int) -> dict[str, Any]:
    engine = _engine(batch_size)
    _admit(engine, batch_size, context, max_new=4 * steps + 16)
    scheduler = engine.scheduler
    while scheduler.waiting or scheduler.chunked_req:
        scheduler.step()
    for _ in range(3):
        scheduler.step()

    def run_steps(n: int) -> None:
        for _ in range(n):
            scheduler.step()

    result = profile(run_steps, steps)
    assert len(scheduler.running) == batch_size, "every request must still be decoding"
    return {"phase": "decode", "batch_size": batch_size, "context": context,
            "threads": torch.get_num_threads(), **result}


def prefill_profile(num: int, context: int) -> dict[str, Any]:
    engine = _engine(num)

    def run_steps(n: int) -> None:
        for _ in range(n):
            _admit(engine, num, context, max_new=1)
            while engine.scheduler.has_work:
                engine.scheduler.step()

    result = profile(run_steps, 1)
    return {"phase": "prefill", "requests": num, "context": context, "threads": torch.get_num_threads(),
            "tokens_per_s": num * context / (result["step_ms"] / 1e3), **result}


def _print(row: dict[str, Any]) -> None:
    what = f"decode bs={row['batch_size']}" if row["phase"] == "decode" else f"prefill {row['requests']}x{row['context']}"
    print(f"== {what}: {row['step_ms']:.1f} ms per step ({row['threads']} threads)")
    for op in row["top_ops"][:8]:
        print(f"   {op['share']:6.1%}  {op['self_ms']:9.1f} ms  {op['op']}")
    print("   python (self ms per step):")
    for fn in row["top_python"][:6]:
        print(f"   {fn['self_ms_per_step']:8.2f}  {fn['function']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="current")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    rows = [decode_profile(bs, args.context, args.steps) for bs in args.batch_sizes]
    rows.append(prefill_profile(64, args.context))
    for row in rows:
        _print(row)
    if args.save:
        record = {**provenance("benchmarks.profile_step", sys.argv[1:], device_name("cpu")), "label": args.label,
                  "rows": rows}
        print(f"wrote {write_result(f'profile_step_{args.label}', record)}")


if __name__ == "__main__":
    main()
