"""Offline throughput of `runtime.Engine` on a dummy-weight model: N random prompts submitted at once with
`ignore_eos`, input and output lengths uniform in the workload's ranges, timed end to end after a warm-up.

Workloads:
  llama-3.1-8b  1000 prompts, input 256–1024, output 128–512, greedy (SGLang's bench_offline_throughput form)
  qwen3-0.6b    256 prompts, input and output 100–1024, temperature 0.6 (the nano-vllm / mini-sglang benchmark)

    python -m benchmarks.gpu.offline_throughput --workload llama-3.1-8b [--disable-cuda-graph]
    python -m benchmarks.gpu.offline_throughput --workload qwen3-0.6b --dry-run     # CPU, tiny config, seconds
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.gpu.decode_roofline import DRY_RUN_SETTINGS
from toolkit.bench.offline import throughput_record
from benchmarks.common import provenance, slug, write_result

MODULE = "benchmarks.gpu.offline_throughput"


@dataclass(frozen=True)
class Workload:
    model: str
    num_prompts: int
    input_len: tuple[int, int]  # inclusive range
    output_len: tuple[int, int]
    temperature: float


WORKLOADS = {
    "llama-3.1-8b": Workload("llama-3.1-8b", 1000, (256, 1024), (128, 512), 0.0),
    "qwen3-0.6b": Workload("qwen3-0.6b", 256, (100, 1024), (100, 1024), 0.6),
}


def dry_run_workload(workload: Workload) -> Workload:
    return dataclasses.replace(workload, num_prompts=4, input_len=(8, 24), output_len=(4, 8))


def random_requests(workload: Workload, vocab_size: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per prompt, lengths uniform in the workload's inclusive ranges."""
    rng = random.Random(seed)
    requests = []
    for _ in range(workload.num_prompts):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(*workload.input_len))]
        requests.append((prompt, rng.randint(*workload.output_len)))
    return requests


class DecodeStepCounter:
    """Counts decode forwards and those that replayed a CUDA graph, by wrapping the runner's forward."""

    def __init__(self, runner) -> None:
        self.decode_steps = self.graph_steps = 0
        self._runner, self._forward = runner, runner.forward
        runner.forward = self._counted

    def _counted(self, batch):
        output = self._forward(batch)
        if batch.mode.is_decode:
            self.decode_steps += 1
            self.graph_steps += int(output.used_cuda_graph)
        return output

    def reset(self) -> None:
        self.decode_steps = self.graph_steps = 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="llama-3.1-8b")
    parser.add_argument("--num-prompts", type=int, default=None, help="override the workload's prompt count")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help='extra Engine/ServerArgs settings as JSON, e.g. {"mem_fraction_static": 0.85}')
    parser.add_argument("--out", type=Path, default=None, help="folder for the result JSON")
    parser.add_argument("--json-out", type=Path, default=None, help="write the record to exactly this file")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny config, 4 short prompts")
    return parser


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    workload = WORKLOADS[opts.workload]
    if opts.dry_run:
        workload = dry_run_workload(workload)
    if opts.num_prompts is not None:
        workload = dataclasses.replace(workload, num_prompts=opts.num_prompts)
    device = torch.device("cpu" if opts.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{MODULE} needs a CUDA GPU; use --dry-run to exercise it on CPU")
    record = {"meta": provenance(MODULE, argv, device, dry_run=opts.dry_run), **run(workload, opts, device)}
    print_summary(record)
    if opts.out is not None:
        graph = "graph_off" if opts.disable_cuda_graph else "graph_on"
        overlap = "" if record["overlap_schedule"] else "_overlap_off"
        name = f"offline_{workload.model}_{graph}{overlap}_{slug(record['meta']['device'])}"
        print(f"wrote {write_result(name, record, opts.out)}")
    if opts.json_out is not None:
        opts.json_out.write_text(json.dumps(record, indent=2) + "\n")
    return record


def engine_settings(workload: Workload, opts: argparse.Namespace, device: torch.device) -> dict:
    settings = dict(load_format="dummy", dtype=opts.dtype, device=device.type, random_seed=opts.seed,
                    attention_backend=opts.attention_backend, disable_cuda_graph=opts.disable_cuda_graph,
                    log_level="warning")
    if opts.dry_run:
        settings.update(DRY_RUN_SETTINGS)
    return {**settings, **opts.engine_args}


def run(workload: Workload, opts: argparse.Namespace, device: torch.device) -> dict:
    from toolkit.runtime.engine import Engine

    engine = Engine(model_path=workload.model, **engine_settings(workload, opts, device))
    counter = DecodeStepCounter(engine.runner)
    requests = random_requests(workload, engine.runner.config.vocab_size, opts.seed)
    engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})  # warm-up
    counter.reset()
    params = [{"max_new_tokens": n, "temperature": workload.temperature, "ignore_eos": True} for _, n in requests]
    start = time.perf_counter()
    results = engine.generate(input_ids=[ids for ids, _ in requests], sampling_params=params)
    latency = time.perf_counter() - start
    input_tokens = sum(len(ids) for ids, _ in requests)
    output_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    graphs = engine.runner.graph_runner
    return {
        "benchmark": "offline throughput through runtime.Engine",
        "workload": dataclasses.asdict(workload),
        "dtype": opts.dtype,
        "attention_backend": engine.runner.attention_backend_name,
        "cuda_graph_requested": not opts.disable_cuda_graph,
        "overlap_schedule": not engine.server_args.disable_overlap_schedule,
        "captured_batch_sizes": graphs.batch_sizes if graphs else [],
        "max_total_num_tokens": engine.runner.max_total_num_tokens,
        "max_running_requests": engine.scheduler.max_running_requests,
        "decode_steps": counter.decode_steps,
        "graph_decode_steps": counter.graph_steps,
        **throughput_record(len(results), latency, input_tokens, output_tokens),
    }


def print_summary(record: dict) -> None:
    workload = record["workload"]
    graphs = f"{record['graph_decode_steps']}/{record['decode_steps']} decode steps in CUDA graphs"
    overlap = "overlap on" if record["overlap_schedule"] else "overlap off"
    print(f"{record['benchmark']}: {workload['model']} x {workload['num_prompts']} prompts on "
          f"{record['meta']['device']} ({record['attention_backend']}, {graphs}, {overlap}): "
          f"output {record['output_throughput']:.1f} tok/s, total {record['total_throughput']:.1f} tok/s, "
          f"{record['total_latency']:.2f} s")


if __name__ == "__main__":
    main()
