"""Online throughput over HTTP (`toolkit serve` + `toolkit bench --rate inf`) vs the in-process Engine on the
same workload, and the HTTP overhead of a one-token request, measured one after the other on this machine.

    python -m benchmarks.http_vs_engine [--num-prompts 64 --input-len 256 --output-len 128] [--rounds 2] [--save]

Both sides run alternately `--rounds` times and each keeps its best: this machine's speed drifts between runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_random_at_full_rate, device_name, provenance, random_requests, write_result
from toolkit.tune.launcher import ServerProcess

ONE_TOKEN_TRIALS = 20
STARTUP_TIMEOUT = 300.0


def http_run(args, workdir: Path) -> dict:
    import requests

    with ServerProcess.toolkit_serve("--log-level", "warning", output_path=workdir / "serve.out") as server:
        server.wait_healthy(STARTUP_TIMEOUT)
        out = workdir / "http.jsonl"
        record = bench_random_at_full_rate(server.url, args.num_prompts, args.input_len, args.output_len, out)
        info = requests.get(f"{server.url}/get_server_info", timeout=10).json()
        latencies = []
        for _ in range(ONE_TOKEN_TRIALS):
            start = time.perf_counter()
            requests.post(f"{server.url}/generate", json={"input_ids": [1000, 2000, 3000, 4000],
                                                          "sampling_params": {"max_new_tokens": 1}}, timeout=60)
            latencies.append(time.perf_counter() - start)
    return {"output_throughput": record["output_throughput"], "duration": record["duration"],
            "completed": record["completed"], "one_token_ms": statistics.median(latencies) * 1e3,
            "device": info.get("device", "unknown")}


def engine_run(args) -> dict:
    from toolkit.runtime import Engine

    engine = Engine(log_level="warning")
    requests_ = random_requests(args.num_prompts, args.input_len, args.output_len, 1.0,
                                engine.runner.config.vocab_size, 1, set(engine.tokenizer.all_special_ids))
    engine.generate(input_ids=[[1000, 2000]], sampling_params={"max_new_tokens": 2})
    params = {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    results = engine.generate(input_ids=[r.input_ids for r in requests_], sampling_params=params)
    duration = time.perf_counter() - start
    output_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    latencies = []
    for _ in range(ONE_TOKEN_TRIALS):
        start = time.perf_counter()
        engine.generate(input_ids=[1000, 2000, 3000, 4000], sampling_params={"max_new_tokens": 1})
        latencies.append(time.perf_counter() - start)
    return {"output_throughput": output_tokens / duration, "duration": duration,
            "one_token_ms": statistics.median(latencies) * 1e3, "device": device_name(engine.runner.device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="alternate HTTP and Engine runs; keep each side's best")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    http_runs, engine_runs = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as workdir:
            http_runs.append(http_run(args, Path(workdir)))
        engine_runs.append(engine_run(args))
    http = max(http_runs, key=lambda r: r["output_throughput"])
    engine = max(engine_runs, key=lambda r: r["output_throughput"])
    http["one_token_ms"] = min(r["one_token_ms"] for r in http_runs)
    engine["one_token_ms"] = min(r["one_token_ms"] for r in engine_runs)
    ratio = http["output_throughput"] / engine["output_throughput"]
    print("all rounds (output tok/s): HTTP " + ", ".join(f"{r['output_throughput']:.1f}" for r in http_runs)
          + "; Engine " + ", ".join(f"{r['output_throughput']:.1f}" for r in engine_runs))
    print(f"HTTP (toolkit serve, bench --rate inf): {http['output_throughput']:8.1f} output tok/s")
    print(f"in-process Engine:                      {engine['output_throughput']:8.1f} output tok/s")
    print(f"ratio HTTP / Engine: {ratio:.2f}")
    print(f"one-token request: HTTP {http['one_token_ms']:.1f} ms vs Engine {engine['one_token_ms']:.1f} ms "
          f"(HTTP overhead {http['one_token_ms'] - engine['one_token_ms']:.1f} ms, median of {ONE_TOKEN_TRIALS})")
    if args.save:
        record = {**provenance("benchmarks.http_vs_engine", sys.argv[1:], engine["device"]),
                  "workload": vars(args), "http": http, "engine": engine, "ratio": ratio,
                  "http_rounds": http_runs, "engine_rounds": engine_runs}
        print(f"wrote {write_result('http_vs_engine', record)}")


if __name__ == "__main__":
    main()
