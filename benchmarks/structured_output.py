"""What constrained decoding costs: `python -m benchmarks.structured_output` (add `--save` to keep the result in
benchmarks/results/structured_output_cpu.json and every run in its .runs.jsonl; `--vllm` adds vLLM-CPU's structured
outputs on the same workload and client).

Starts `toolkit serve` (the embedded model, CPU) and runs the same `toolkit bench` workload with every request
constrained to one JSON schema (`--json-schema`, a list of short strings) and free (the same prompts and output
lengths, EOS ignored), interleaved per repeat, at batch 1 and 64 (`--max-concurrency`, rate inf). Prints per batch
the median TPOT constrained / free of the repeats (and their spread), and at batch 1 the TTFT of a request whose
grammar is already compiled and cached against a free one's, and a never-seen schema's (compiled on arrival).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from benchmarks.common import provenance, write_result
from benchmarks.soak import run_bench, wait_idle
from benchmarks.vs_vllm import SERVED_NAME, Peers, vllm_server
from toolkit.tune.launcher import ServerProcess, free_port, toolkit_command

STARTUP_TIMEOUT = 300.0
VLLM_STARTUP_TIMEOUT = 900.0
MIN_REQUESTS = 4  # per run: batch 1 sends them one after another
TOPICS = ["fruits", "rivers", "birds", "colours", "tools", "cities", "trees", "planets", "metals", "games",
          "flowers", "fish"]


def schema(items: int, tag: str = "") -> dict:
    """A list of `items` short strings: long enough to time decoding, one grammar for every request."""
    return {"type": "object", "description": tag,
            "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                     "minItems": items, "maxItems": items}},
            "required": ["items"], "additionalProperties": False}


def write_prompts(path: Path, count: int, output_len: int) -> None:
    with path.open("w") as out:
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            out.write(json.dumps({"prompt": f"List {topic} as a JSON object with an 'items' array ({i}).",
                                  "output_len": output_len}) + "\n")


def bench_command(url: str, backend: str, prompts: Path, count: int, concurrency: int, out: Path,
                  schema_file: Path | None) -> list[str]:
    command = toolkit_command(
        "bench", "--base-url", url, "--backend", backend, "--dataset", "custom", "--dataset-path", str(prompts),
        "--num-prompts", str(count), "--rate", "inf", "--max-concurrency", str(concurrency), "--ignore-eos",
        "--warmup-requests", "1", "--no-progress", "--output-file", str(out))
    return command + (["--json-schema", str(schema_file)] if schema_file else [])


def cold_ttft_ms(url: str, backend: str, items: int) -> float:
    """One request with a schema this server has never seen: its TTFT includes compiling the grammar."""
    fresh = schema(items, tag=f"fresh {time.time_ns()}")
    if backend == "sglang":
        body = {"text": "List fruits as JSON.", "sampling_params": {"max_new_tokens": 1, "json_schema": json.dumps(fresh)}}
        path = "/generate"
    else:
        body = {"model": SERVED_NAME, "prompt": "List fruits as JSON.", "max_tokens": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": fresh}}}
        path = "/v1/completions"
    started = time.perf_counter()
    response = requests.post(url + path, json=body, timeout=600)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def measure(url: str, backend: str, args: argparse.Namespace, work: Path, schema_file: Path,
                  prompts: Path) -> list[dict]:
    runs = []
    for repeat in range(args.repeats):
        for batch in args.batch_sizes:
            count = max(batch * args.rounds, MIN_REQUESTS)
            for mode in ("free", "constrained"):
                out = work / f"{backend}_{batch}_{mode}_{repeat}.jsonl"
                command = bench_command(url, backend, prompts, count, batch, out,
                                        schema_file if mode == "constrained" else None)
                record = await run_bench(command)
                if backend == "sglang":
                    await wait_idle(url)
                runs.append({"repeat": repeat, "batch": batch, "mode": mode, "completed": record["completed"],
                             "failed": record["failed"], "median_tpot_ms": record["median_tpot_ms"],
                             "mean_tpot_ms": record["mean_tpot_ms"], "median_ttft_ms": record["median_ttft_ms"],
                             "output_throughput": record["output_throughput"],
                             "total_output_tokens": record["total_output_tokens"]})
                print(json.dumps(runs[-1]), flush=True)
        runs.append({"repeat": repeat, "cold_grammar_ttft_ms": cold_ttft_ms(url, backend, args.items)})
    return runs


def summary(runs: list[dict], batch_sizes: list[int]) -> dict:
    out: dict = {}
    for batch in batch_sizes:
        pairs = {}
        for run in runs:
            if run.get("batch") == batch:
                pairs.setdefault(run["repeat"], {})[run["mode"]] = run
        tpot = sorted(p["constrained"]["median_tpot_ms"] / p["free"]["median_tpot_ms"] for p in pairs.values())
        ttft = sorted(p["constrained"]["median_ttft_ms"] / p["free"]["median_ttft_ms"] for p in pairs.values())
        out[f"batch_{batch}"] = {
            "tpot_ratio_median": statistics.median(tpot), "tpot_ratio_spread": [tpot[0], tpot[-1]],
            "ttft_ratio_median": statistics.median(ttft), "ttft_ratio_spread": [ttft[0], ttft[-1]],
            "free_median_tpot_ms": statistics.median(p["free"]["median_tpot_ms"] for p in pairs.values()),
            "constrained_median_tpot_ms": statistics.median(p["constrained"]["median_tpot_ms"] for p in pairs.values()),
            "free_median_ttft_ms": statistics.median(p["free"]["median_ttft_ms"] for p in pairs.values()),
            "cached_grammar_median_ttft_ms": statistics.median(p["constrained"]["median_ttft_ms"]
                                                               for p in pairs.values()),
        }
    cold = [r["cold_grammar_ttft_ms"] for r in runs if "cold_grammar_ttft_ms" in r]
    out["cold_grammar_ttft_ms_median"] = statistics.median(cold) if cold else None
    return out


async def one_server(name: str, server: ServerProcess, timeout: float, backend: str, args, work: Path,
                     schema_file: Path, prompts: Path) -> dict:
    try:
        server.wait_healthy(timeout)
        runs = await measure(server.url, backend, args, work, schema_file, prompts)
    finally:
        server.stop()
    result = {"runs": runs, **summary(runs, args.batch_sizes)}
    print(f"{name}: " + json.dumps({k: v for k, v in result.items() if k != "runs"}), flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.structured_output", description=__doc__)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=1, help=f"requests per run = batch × rounds (at least "
                                                                  f"{MIN_REQUESTS})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--items", type=int, default=24, help="strings in the schema's list")
    parser.add_argument("--output-len", type=int, default=128, help="max tokens per request")
    parser.add_argument("--serve-flags", nargs="*", default=[], help="extra `toolkit serve` flags")
    parser.add_argument("--vllm", action="store_true", help="also vLLM-CPU (../peers/peer_vllm), same client")
    parser.add_argument("--peers-root", type=Path, default=Path("/work/peers"))
    parser.add_argument("--save", action="store_true")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="structured-") as tmp:
        work = Path(tmp)
        schema_file, prompts = work / "schema.json", work / "prompts.jsonl"
        schema_file.write_text(json.dumps(schema(args.items)))
        write_prompts(prompts, max(max(args.batch_sizes) * args.rounds, MIN_REQUESTS), args.output_len)
        ours = ServerProcess.toolkit_serve("--device", "cpu", "--served-model-name", SERVED_NAME, *args.serve_flags,
                                           log_file=work / "server.log", output_path=work / "serve.out")
        results["toolkit"] = asyncio.run(one_server("toolkit", ours, STARTUP_TIMEOUT, "sglang", args, work,
                                                    schema_file, prompts))
        if args.vllm:
            peers = Peers(args.peers_root)
            if peers.missing():
                print(f"vLLM-CPU not measured: missing {', '.join(peers.missing())}")
            else:
                port = free_port()
                theirs = vllm_server(peers, port, work / "vllm.out", "float32", {})
                results["vllm"] = asyncio.run(one_server("vllm", theirs, VLLM_STARTUP_TIMEOUT, "openai", args, work,
                                                         schema_file, prompts))
    record = {**provenance("benchmarks.structured_output", sys.argv[1:]), "items": args.items,
              "output_len": args.output_len, "batch_sizes": args.batch_sizes, "rounds": args.rounds,
              "repeats": args.repeats, "client": "toolkit bench", "results": results}
    if args.save:
        print(f"saved {write_result('structured_output_cpu', record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
