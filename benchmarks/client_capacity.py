"""How fast can this client send? `python -m benchmarks.client_capacity` (add `--save` to keep the result).

Starts the scripted stub server (tests/bench/stub.py) in its own process (64-token streamed responses, one SSE event
per token), then runs
the real load loop in this process at rising rates for a few seconds each, and prints for every rate the achieved
rate over the requested one and the send lag. The answer is the highest rate with achieved/requested >= 0.99 and
every request completed.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

from benchmarks.common import REPO, free_port, provenance, write_result
from toolkit.bench import eventloop
from toolkit.bench.arrivals import schedule
from toolkit.bench.benchmark import RunSettings, Target, measure
from toolkit.bench.datasets import Prompt
from toolkit.bench.metrics import summarize
from toolkit.bench.verdict import judge
from toolkit.bench.workload import Workload

SUSTAINED = 0.99


def _wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the stub did not open port {port}")


def _workload(rate: float, seconds: float, tokens: int, arrival: str) -> Workload:
    offsets = schedule(rate, duration=seconds, arrival=arrival, seed=0)
    prompt = Prompt(text="capacity", input_len=8, output_len=tokens, input_ids=list(range(8)))
    return Workload([prompt] * len(offsets), offsets, rate, arrival)


def _step(base_url: str, backend: str, rate: float, seconds: float, tokens: int, arrival: str) -> dict:
    workload = _workload(rate, seconds, tokens, arrival)
    cpu = time.process_time()
    measured = eventloop.run(measure(Target(base_url, backend, model="stub"), RunSettings(request_timeout=60),
                                   workload))
    run = measured.run
    summary, verdict = summarize(run.outcomes, run.duration), judge(run.outcomes, run.start)
    achieved = verdict.achieved_rate or 0.0
    return {
        "rate": rate, "requests": len(workload), "completed": summary["completed"], "errors": summary["errors"],
        "achieved_rate": achieved, "achieved_over_requested": achieved / rate,
        "send_lag_p50_ms": verdict.send_lag_p50_ms, "send_lag_p99_ms": verdict.send_lag_p99_ms,
        "output_tokens_per_s": summary["output_throughput"], "mean_ttft_ms": summary["mean_ttft_ms"],
        "client_cpu_share": (time.process_time() - cpu) / max(run.duration, 1e-9),
    }


def _sustained(step: dict) -> bool:
    return step["achieved_over_requested"] >= SUSTAINED and step["completed"] == step["requests"]


def _print(step: dict) -> None:
    print(f"rate {step['rate']:7.0f}/s  achieved {step['achieved_rate']:8.1f}/s  ratio "
          f"{step['achieved_over_requested']:.4f}  send lag p50 {step['send_lag_p50_ms']:6.2f} ms  p99 "
          f"{step['send_lag_p99_ms']:7.2f} ms  completed {step['completed']}/{step['requests']}  "
          f"out {step['output_tokens_per_s']:8.0f} tok/s  client cpu {step['client_cpu_share']:.2f}", flush=True)


def run(rates: list[float], seconds: float, tokens: int, backend: str, arrival: str) -> dict:
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "tests.bench.stub", "--port", str(port), "--tokens", str(tokens)],
                            cwd=REPO)
    try:
        _wait_for_port(port)
        steps = []
        for rate in rates:
            steps.append(_step(f"http://127.0.0.1:{port}", backend, rate, seconds, tokens, arrival))
            _print(steps[-1])
            if not _sustained(steps[-1]):
                break
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    best = max((s["rate"] for s in steps if _sustained(s)), default=None)
    best_step = next((s for s in steps if s["rate"] == best), None)
    print(f"highest sustained rate: {best} req/s"
          + (f" (send lag p99 {best_step['send_lag_p99_ms']:.2f} ms)" if best_step else ""))
    return {"highest_sustained_rate": best, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="250,500,750,1000,1250,1500,2000,2500,3000")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of arrivals per rate")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--backend", default="sglang", choices=["sglang", "openai", "openai-chat"])
    parser.add_argument("--arrival", default="constant", choices=["constant", "poisson"])
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/client_capacity.json")
    args = parser.parse_args()
    result = run([float(r) for r in args.rates.split(",")], args.seconds, args.tokens, args.backend, args.arrival)
    if args.save:
        record = {**provenance("benchmarks.client_capacity", sys.argv[1:]), **result}
        print(f"wrote {write_result('client_capacity', record)}")


if __name__ == "__main__":
    main()
