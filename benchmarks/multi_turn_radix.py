"""What the radix cache buys a multi-turn chat: `python -m benchmarks.multi_turn_radix` (add `--save` to keep the
result in benchmarks/results/multi_turn_radix.json and every run in its .runs.jsonl).

Starts `toolkit serve` (the embedded model, `--enable-cache-report`) with the radix cache on, then a fresh one with
`--disable-radix-cache`, and runs the same `toolkit bench` multi-turn workload against each (chat sessions of
`--turns` turns arriving at `--rate` sessions/s, each turn's messages the conversation so far with the server's real
replies, same `--seed`). Prints per turn the mean TTFT and the server-reported cache-hit rate with the cache on and
off, and the later turns' TTFT ratio off/on measured in this same run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.common import provenance, write_result
from benchmarks.soak import run_bench, wait_idle
from toolkit.demo import QUESTIONS
from toolkit.tune.launcher import ServerProcess, toolkit_command

STARTUP_TIMEOUT = 300.0


def bench_command(url: str, args: argparse.Namespace, prompts: Path, out: Path) -> list[str]:
    return toolkit_command(
        "bench", "--base-url", url, "--backend", "openai-chat", "--dataset", "custom", "--dataset-path", str(prompts),
        "--sharegpt-output-len", str(args.output_len), "--turns", str(args.turns), "--think-time",
        str(args.think_time), "--rate", str(args.rate), "--arrival", "constant", "--num-prompts",
        str(args.sessions), "--seed", "7", "--warmup-requests", "1", "--no-progress", "--output-file", str(out))


async def one_server(cache: str, flags: tuple[str, ...], args: argparse.Namespace, prompts: Path,
                     workdir: Path) -> dict:
    folder = workdir / cache
    folder.mkdir()
    server = ServerProcess.toolkit_serve("--enable-cache-report", "--device", "cpu", *flags,
                                         log_file=folder / "server.log", output_path=folder / "serve.out")
    try:
        server.wait_healthy(STARTUP_TIMEOUT)
        record = await run_bench(bench_command(server.url, args, prompts, folder / "run.jsonl"))
        await wait_idle(server.url)
    finally:
        server.stop()
    return record


def summary(cache: str, record: dict) -> dict:
    later = [t for t in record["by_turn"] if t["turn"] > 1]
    later_ttft = sum(t["mean_ttft_ms"] * t["completed"] for t in later) / max(sum(t["completed"] for t in later), 1)
    return {"radix_cache": cache, "completed": record["completed"], "num_requests": record["num_requests"],
            "cache_hit_rate": record["cache_hit_rate"],
            "cache_hit_rate_first_turn": record["cache_hit_rate_first_turn"],
            "cache_hit_rate_later_turns": record["cache_hit_rate_later_turns"],
            "mean_ttft_ms": record["mean_ttft_ms"], "later_turns_mean_ttft_ms": later_ttft,
            "output_throughput": record["output_throughput"], "by_turn": record["by_turn"]}


def print_table(rows: list[dict]) -> None:
    on, off = rows
    print(f"{'turn':>4}  {'TTFT on ms':>10}  {'TTFT off ms':>11}  {'off/on':>6}  {'hit on':>6}  {'hit off':>7}")
    for a, b in zip(on["by_turn"], off["by_turn"]):
        ratio = b["mean_ttft_ms"] / a["mean_ttft_ms"] if a["mean_ttft_ms"] else float("nan")
        print(f"{a['turn']:>4}  {a['mean_ttft_ms']:>10.1f}  {b['mean_ttft_ms']:>11.1f}  {ratio:>6.2f}  "
              f"{a['cache_hit_rate'] or 0:>6.2f}  {b['cache_hit_rate'] or 0:>7.2f}")
    print(f"later turns: TTFT {on['later_turns_mean_ttft_ms']:.1f} ms with the cache, "
          f"{off['later_turns_mean_ttft_ms']:.1f} ms without ({off['later_turns_mean_ttft_ms'] / on['later_turns_mean_ttft_ms']:.2f}x); "
          f"cache-hit rate {on['cache_hit_rate_later_turns']:.2f} vs {off['cache_hit_rate_later_turns'] or 0:.2f}")


async def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prompts = workdir / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS))
        rows = [summary("on", await one_server("on", (), args, prompts, workdir)),
                summary("off", await one_server("off", ("--disable-radix-cache",), args, prompts, workdir))]
    print_table(rows)
    on, off = rows
    return {"workload": {"sessions": args.sessions, "turns": args.turns, "rate": args.rate,
                         "think_time": args.think_time, "output_len": args.output_len},
            "rows": rows, "later_turns_ttft_off_over_on": off["later_turns_mean_ttft_ms"] / on["later_turns_mean_ttft_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rate", type=float, default=0.5, help="sessions per second")
    parser.add_argument("--think-time", type=float, default=0.5)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    if args.sessions * args.turns > len(QUESTIONS):
        parser.error(f"--sessions x --turns must be at most {len(QUESTIONS)} (the demo's questions)")
    result = asyncio.run(run(args))
    if args.save:
        record = {**provenance("benchmarks.multi_turn_radix", sys.argv[1:]), **result}
        print(f"wrote {write_result('multi_turn_radix', record)}")


if __name__ == "__main__":
    main()
