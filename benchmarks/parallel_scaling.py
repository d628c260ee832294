"""Serving throughput with --tp-size 2 and with --dp-size 2 against one process, on this machine's CPU.

    python -m benchmarks.parallel_scaling [--num-prompts 32 --input-len 128 --output-len 64 --rounds 2] [--save]

The model is SmolLM2-135M's shape with 8 heads and 4 KV heads of 64 (so that its heads split by 2), random weights
(`--load-format dummy`), the dtype `--dtype auto` picks on this CPU, the embedded tokenizer. Each configuration is `toolkit serve` loaded by
`toolkit bench --rate inf` with random prompts of exactly `--input-len` tokens and outputs of exactly
`--output-len`; the configurations run in turn `--rounds` times and each keeps its best (this machine's speed
drifts). On a 2-core CPU neither kind of parallelism can gain: the cores are the same, TP adds two all-reduces per
layer over gloo, DP halves each replica's batch. The point is that they run, and what they cost here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import bench_random_at_full_rate, device_name, provenance, write_result
from toolkit.runtime.model_loader.embedded import embedded_model_path
from toolkit.tune.launcher import ServerProcess

STARTUP_TIMEOUT = 300.0
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}
LAYOUTS = {"tp1": (), "tp2": ("--tp-size", "2"), "dp2": ("--dp-size", "2")}


def serve_and_bench(model: Path, layout: tuple[str, ...], args, workdir: Path, name: str) -> dict:
    flags = ("--model-path", str(model), "--load-format", "dummy", "--tokenizer-path", str(embedded_model_path()),
             "--device", "cpu", "--max-total-tokens", "20000", "--log-level", "warning",
             *layout)
    with ServerProcess.toolkit_serve(*flags, output_path=workdir / f"{name}.out") as server:
        server.wait_healthy(STARTUP_TIMEOUT)
        out = workdir / f"{name}.jsonl"
        record = bench_random_at_full_rate(server.url, args.num_prompts, args.input_len, args.output_len, out)
    return {"output_throughput": record["output_throughput"], "duration": record["duration"],
            "completed": record["completed"], "median_ttft_ms": record.get("median_ttft_ms"),
            "median_tpot_ms": record.get("median_tpot_ms")}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/parallel_scaling_cpu.json")
    args = parser.parse_args(argv)
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-scaling-") as tmp:
        workdir = Path(tmp)
        model = workdir / "llama-8h"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(CONFIG))
        for round_ in range(args.rounds):
            for name, layout in LAYOUTS.items():
                result = serve_and_bench(model, layout, args, workdir, f"{name}-{round_}")
                print(f"round {round_ + 1} {name}: {result['output_throughput']:.1f} output tok/s "
                      f"({result['completed']} requests in {result['duration']:.1f} s)", flush=True)
                if name not in best or result["output_throughput"] > best[name]["output_throughput"]:
                    best[name] = result
    tp_ratio = best["tp2"]["output_throughput"] / best["tp1"]["output_throughput"]
    dp_ratio = best["dp2"]["output_throughput"] / best["tp1"]["output_throughput"]
    print(f"tp=2 vs tp=1: {best['tp2']['output_throughput']:.1f} vs {best['tp1']['output_throughput']:.1f} output "
          f"tok/s ({tp_ratio:.2f}x); dp=2 vs dp=1: {best['dp2']['output_throughput']:.1f} vs "
          f"{best['tp1']['output_throughput']:.1f} ({dp_ratio:.2f}x) on {os.cpu_count()} CPU cores")
    if args.save:
        path = write_result("parallel_scaling_cpu", {
            **provenance("benchmarks.parallel_scaling", argv, device_name("cpu"), num_prompts=args.num_prompts,
                         input_len=args.input_len, output_len=args.output_len, rounds=args.rounds,
                         model="SmolLM2-135M shape with 8 heads / 4 KV heads, dummy weights, dtype auto"),
            "best": best, "tp2_over_tp1": tp_ratio, "dp2_over_dp1": dp_ratio})
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
