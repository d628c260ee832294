"""Does `toolkit bench --workers 2` measure better than one process at high rates? `python -m
benchmarks.client_workers` (add `--save` to keep the result in benchmarks/results/client_workers.json).

Starts the scripted stub server (tests/bench/stub.py: first token after 5 ms, then one token per 1 ms) in its own
process, then runs the real `toolkit bench` command at each rate with `--workers 1` and `--workers 2`, and prints
per configuration the achieved rate, TTFT p50/p99, the loop lag p99 and the verdict's two facts, with the ratio of
each TTFT to the `--workers 1` run at the same rate measured in this same invocation. The stub's true TTFT is 5 ms:
whatever a configuration measures above it is client-side (or stub-side) delay.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.client_capacity import _wait_for_port
from benchmarks.common import REPO, free_port, provenance, write_result
from toolkit.tune.launcher import toolkit_command

KEPT = ("request_rate", "workers", "completed", "num_requests", "achieved_rate", "median_ttft_ms", "p99_ttft_ms",
        "median_itl_ms", "send_lag_p99_ms", "loop_lag_p99_ms", "dispatch_kept_up", "timing_kept_up",
        "client_verdict", "per_worker")


def _bench(url: str, rate: float, workers: int, seconds: float, tokens: int, out: Path) -> dict:
    subprocess.run(toolkit_command(
        "bench", "--base-url", url, "--backend", "sglang", "--dataset", "random", "--random-input-len", "16",
        "--random-output-len", str(tokens), "--random-range-ratio", "1", "--arrival", "constant", "--rate", f"{rate:g}",
        "--num-prompts", str(int(rate * seconds)), "--workers", str(workers), "--warmup-requests", "2",
        "--no-progress", "--output-file", str(out)), check=True, stdout=subprocess.DEVNULL)
    record = json.loads(out.read_text().splitlines()[-1])
    return {key: record.get(key) for key in KEPT}


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _print(step: dict) -> None:
    def fmt(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(f"rate {step['request_rate']:6.0f}/s  workers {step['workers']}  achieved {fmt(step['achieved_rate'], '8.1f')}"
          f"/s  TTFT p50 {fmt(step['median_ttft_ms'], '6.2f')} ms (x{fmt(step['ttft_p50_vs_workers_1'], '.2f')})  "
          f"p99 {fmt(step['p99_ttft_ms'], '7.2f')} ms (x{fmt(step['ttft_p99_vs_workers_1'], '.2f')})  loop lag p99 "
          f"{fmt(step['loop_lag_p99_ms'], '5.2f')} ms  dispatch {'ok' if step['dispatch_kept_up'] else 'BEHIND'}  "
          f"timing {'ok' if step['timing_kept_up'] else 'LATE'}  completed {step['completed']}/{step['num_requests']}",
          flush=True)


def run(rates: list[float], workers: list[int], seconds: float, tokens: int) -> dict:
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "tests.bench.stub", "--port", str(port), "--tokens", str(tokens),
                             "--ttft-ms", "5", "--itl-ms", "1"], cwd=REPO)
    steps = []
    try:
        _wait_for_port(port)
        with tempfile.TemporaryDirectory() as tmp:
            for rate in rates:
                base = None
                for n in workers:
                    step = _bench(f"http://127.0.0.1:{port}", rate, n, seconds, tokens, Path(tmp) / f"{rate}-{n}.jsonl")
                    base = base or step
                    step["ttft_p50_vs_workers_1"] = _ratio(step["median_ttft_ms"], base["median_ttft_ms"])
                    step["ttft_p99_vs_workers_1"] = _ratio(step["p99_ttft_ms"], base["p99_ttft_ms"])
                    steps.append(step)
                    _print(step)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    return {"stub": {"ttft_ms": 5.0, "itl_ms": 1.0, "tokens": tokens}, "seconds_per_run": seconds, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="250,500,1000,2000")
    parser.add_argument("--workers", default="1,2", help="worker counts; the first is the baseline of the ratios")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of arrivals per run")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/client_workers.json")
    args = parser.parse_args()
    result = run([float(r) for r in args.rates.split(",")], [int(w) for w in args.workers.split(",")],
                 args.seconds, args.tokens)
    if args.save:
        record = {**provenance("benchmarks.client_workers", sys.argv[1:]), **result}
        print(f"wrote {write_result('client_workers', record)}")


if __name__ == "__main__":
    main()
