"""Can the HTTP front end keep up with the scheduler? N concurrent SSE streams at one token per decode step: the
client's per-token ITL p50 should equal the decode step time the server logs (within 10%).

    python -m benchmarks.sse_streams [--streams 256] [--output-len 64] [--save]

The server runs a one-layer dummy Llama (SmolLM2's vocabulary) so decode steps are short and the front end, not
the model, is what is measured: at 256 streams and ~10-20 ms steps it relays 10-25k token events per second.
`--decode-log-interval 1` makes every step log its time: a `Decode batch.` line's gen throughput is the step's
batch size over the wall time since the previous decode line, so step time = #running-req / gen throughput, a
prefill in between included, as the client's gap between two tokens includes it. Each step gives one token to each
of its #running-req streams, so the log's per-token p50 is the median of the step times weighted by batch size:
that is what the client's ITL p50 is compared with. The p50 over full-batch steps alone (no prefill in between) is
reported beside it. The client is `toolkit bench` (per-token accounting, native streaming endpoint).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import device_name, provenance, write_result
from toolkit.tune.launcher import ServerProcess, toolkit_command

TINY_LLAMA = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152}
DECODE_RE = re.compile(r"Decode batch\. #running-req: (\d+),.* gen throughput \(token/s\): ([\d.]+),")
STARTUP_TIMEOUT = 300.0


def _logged_steps(log: Path) -> list[tuple[int, float] | None]:
    """Per step line: (#running-req, step ms) for a decode step with a measured throughput, None for a prefill or
    a decode line without one."""
    steps: list[tuple[int, float] | None] = []
    for line in log.read_text().splitlines():
        if "] Prefill batch." in line:
            steps.append(None)
        elif (match := DECODE_RE.search(line)) is not None:
            throughput = float(match.group(2))
            steps.append((int(match.group(1)), int(match.group(1)) / throughput * 1e3) if throughput > 0 else None)
    return steps


def decode_steps(log: Path) -> list[tuple[int, float]]:
    """(#running-req, step ms) of every logged decode step but the first, whose time runs from no previous decode
    line (the server's start-up)."""
    return [step for step in _logged_steps(log) if step is not None][1:]


def per_token_median(steps: list[tuple[int, float]]) -> float:
    """The median step time over the tokens the steps produced (a step of batch n counts n times)."""
    times = sorted(steps, key=lambda step: step[1])
    half, seen = sum(n for n, _ in times) / 2, 0
    for n, ms in times:
        seen += n
        if seen >= half:
            return ms
    return float("nan")


def full_step_times_ms(log: Path, batch: int) -> list[float]:
    """Step times of the steps that ran the whole batch right after another such step (no prefill between)."""
    times, previous_full = [], False
    for step in _logged_steps(log):
        full = step is not None and step[0] == batch
        if full and previous_full:
            times.append(step[1])
        previous_full = full
    return times


def run(args, workdir: Path, overlap: bool) -> dict:
    log = workdir / f"server_{'overlap' if overlap else 'sync'}.log"
    flags = ["--model-path", "llama-3.2-1b", "--load-format", "dummy", "--json-model-override-args",
             json.dumps(TINY_LLAMA), "--dtype", "float32", "--device", "cpu", "--decode-log-interval", "1",
             "--max-running-requests", str(args.streams), "--context-length", "2048", "--log-level", "info"]
    flags.append("--enable-overlap-schedule" if overlap else "--disable-overlap-schedule")  # CPU default: off
    records = workdir / "bench.jsonl"
    records.unlink(missing_ok=True)
    with ServerProcess.toolkit_serve(*flags, log_file=log, output_path=workdir / "serve.out") as server:
        server.wait_healthy(STARTUP_TIMEOUT)
        subprocess.run(toolkit_command(
            "bench", "--base-url", server.url, "--backend", "sglang", "--dataset", "random", "--rate", "inf",
            "--num-prompts", str(args.streams), "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--random-range-ratio", "1", "--warmup-requests", "0", "--no-progress",
            "--output-file", str(records)), check=True, stdout=subprocess.DEVNULL, timeout=1800)
    record = json.loads(records.read_text().splitlines()[-1])
    steps, full = decode_steps(log), full_step_times_ms(log, args.streams)
    step_p50 = per_token_median(steps)
    tokens = sum(n for n, _ in steps)
    step_mean = sum(n * ms for n, ms in steps) / tokens if tokens else float("nan")
    itl_p50, itl_mean = record["median_itl_ms"], record["mean_itl_ms"]
    return {"overlap": overlap, "streams": args.streams, "completed": record["completed"],
            "client_itl_p50_ms": itl_p50, "server_step_p50_ms": step_p50, "decode_steps": len(steps),
            "itl_over_step": itl_p50 / step_p50, "client_itl_mean_ms": itl_mean, "server_step_mean_ms": step_mean,
            "itl_mean_over_step_mean": itl_mean / step_mean,
            "full_steps": len(full), "full_step_p50_ms": statistics.median(full) if full else float("nan"),
            "output_throughput": record["output_throughput"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/sse_streams.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sse-streams-") as tmp:
        for overlap in (True, False):
            row = run(args, Path(tmp), overlap)
            rows.append(row)
            print(f"overlap {'on ' if overlap else 'off'}: {row['completed']}/{row['streams']} streams, client ITL p50 "
                  f"{row['client_itl_p50_ms']:.2f} ms vs the log's per-token step p50 {row['server_step_p50_ms']:.2f} ms "
                  f"({row['decode_steps']} steps): ratio {row['itl_over_step']:.3f}; means "
                  f"{row['client_itl_mean_ms']:.2f} vs {row['server_step_mean_ms']:.2f} ms: ratio "
                  f"{row['itl_mean_over_step_mean']:.3f}; full-batch steps p50 {row['full_step_p50_ms']:.2f} ms "
                  f"({row['full_steps']})", flush=True)
    if args.save:
        record = {**provenance("benchmarks.sse_streams", sys.argv[1:], device_name("cpu")), "rows": rows}
        print(f"wrote {write_result('sse_streams', record)}")


if __name__ == "__main__":
    main()
