"""Soak: `toolkit serve` with a small KV pool under `toolkit bench` at twice its capacity, while a chaos client
aborts and disconnects at random; samples RSS, /get_server_info and /health, and reads the log afterwards.

    python -m benchmarks.soak --duration 1800 --save     # the full run; benchmarks/results/soak_cpu.json
    python -m benchmarks.soak --duration 60 --out /tmp/soak.json

It passes when the only errors are the expected client aborts (bench's --request-timeout and the chaos client's
own disconnects), /health answered every sample, the log has no leak line, traceback or 5xx, the pool is empty
once the load stops, RSS is flat after warm-up (its slope is reported), and SIGTERM exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from benchmarks.common import RESULTS, provenance, write_result
from toolkit.tune.launcher import ServerProcess, toolkit_command

STARTUP_TIMEOUT = 300.0
IDLE_TIMEOUT = 120.0
EXPECTED_BENCH_ERRORS = {"timeout"}  # the client gave up: the server aborts those requests, by design
LOG_PROBLEMS = {
    "leak": re.compile(r"memory leak detected"),
    "traceback": re.compile(r"Traceback \(most recent call last\)"),
    "http_5xx": re.compile(r'HTTP/1\.\d" 5\d\d '),
    "scheduler_exception": re.compile(r"Scheduler hit an exception"),
    "unretrieved_future": re.compile(r"Future exception was never retrieved"),
}
CHAOS_KINDS = ("stream_disconnect", "chat_stream_disconnect", "client_timeout", "reset_before_headers", "half_body")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    parser.add_argument("--pool", type=int, default=2048, help="--max-total-tokens of the server")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--overload", type=float, default=2.0, help="bench rate as a multiple of the capacity")
    parser.add_argument("--request-timeout", type=float, default=20.0, help="bench's client-side abort")
    parser.add_argument("--chaos-rate", type=float, default=2.0, help="chaos requests per second")
    parser.add_argument("--sample-interval", type=float, default=None, help="seconds (default: duration/120, 1-10)")
    parser.add_argument("--save", action="store_true", help=f"write {RESULTS.name}/soak_cpu.json")
    parser.add_argument("--out", type=Path, help="write the JSON result here")
    return parser.parse_args(argv)


# ---- load: toolkit bench ----

def bench_command(url: str, args: argparse.Namespace, rate: str, out: Path, **extra: str) -> list[str]:
    flags = ["--base-url", url, "--backend", "sglang", "--dataset", "random", "--rate", rate, "--seed", "7",
             "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
             "--random-range-ratio", "0.5", "--no-progress", "--output-file", str(out)]
    for name, value in extra.items():
        flags += [f"--{name.replace('_', '-')}", value]
    return toolkit_command("bench", *flags)


async def run_bench(command: list[str]) -> dict:
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.PIPE)
    _, stderr = await process.communicate()
    out = Path(command[command.index("--output-file") + 1])
    if not out.exists():
        raise RuntimeError(f"toolkit bench wrote nothing (exit {process.returncode}): {stderr.decode()[-2000:]}")
    return json.loads(out.read_text().splitlines()[-1])


# ---- chaos: clients that abort and disconnect ----

def _reset(port: int, body: bytes, half: bool) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + (body[: len(body) // 2] if half else body))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def _stream_then_leave(session: aiohttp.ClientSession, url: str, path: str, body: dict, events: int) -> None:
    async with session.post(url + path, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        seen = 0
        async for line in response.content:
            seen += line.startswith(b"data: ")
            if seen >= events:
                return


async def chaos_one(session: aiohttp.ClientSession, url: str, port: int, kind: str, rng: random.Random) -> None:
    prompt = f"Soak {rng.randrange(10**6)}: tell me a story about the number {rng.randrange(1000)}."
    if kind == "stream_disconnect":
        body = {"prompt": prompt, "max_tokens": 64, "stream": True, "ignore_eos": True}
        await _stream_then_leave(session, url, "/v1/completions", body, rng.randint(1, 4))
    elif kind == "chat_stream_disconnect":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 64, "stream": True}
        await _stream_then_leave(session, url, "/v1/chat/completions", body, rng.randint(1, 4))
    elif kind == "client_timeout":
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
        try:
            async with session.post(f"{url}/generate", json=body,
                                    timeout=aiohttp.ClientTimeout(total=rng.uniform(0.05, 1.0))) as response:
                await response.read()
        except asyncio.TimeoutError:
            pass
    else:
        body = json.dumps({"prompt": prompt, "max_tokens": 16, "stream": rng.random() < 0.5}).encode()
        await asyncio.to_thread(_reset, port, body, kind == "half_body")


async def chaos(url: str, port: int, rate: float, stop: asyncio.Event, counts: dict, errors: list) -> None:
    rng = random.Random(11)
    tasks: set[asyncio.Task] = set()

    async def one(kind: str) -> None:
        try:
            await chaos_one(session, url, port, kind, rng)
            counts[kind] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the soak
            errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while not stop.is_set():
            task = asyncio.ensure_future(one(rng.choice(CHAOS_KINDS)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            try:
                await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
            except asyncio.TimeoutError:
                pass
        await asyncio.gather(*tasks)


# ---- observation: RSS, counters, health ----

def rss_mb(pid: int) -> tuple[float, float]:
    """(front end, scheduler and any other children) resident memory in MB."""
    process = psutil.Process(pid)
    children = sum(child.memory_info().rss for child in process.children(recursive=True))
    return process.memory_info().rss / 2**20, children / 2**20


async def server_state(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/get_server_info") as response:
        info = await response.json()
    state = info["internal_states"][0]
    return {"num_pending_http_requests": info["num_pending_http_requests"],
            **{key: state.get(key) for key in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage",
                                               "memory_leak_detected", "total_retracted_reqs")}}


async def sample(server: ServerProcess, interval: float, stop: asyncio.Event, samples: list, failures: list) -> None:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            row: dict = {"t": round(time.monotonic() - started, 2)}
            row["front_end_mb"], row["scheduler_mb"] = rss_mb(server.pid)
            try:
                tic = time.monotonic()
                async with session.get(f"{server.url}/health") as response:
                    row["health"] = response.status
                row["health_ms"] = round((time.monotonic() - tic) * 1e3, 1)
                row |= await server_state(session, server.url)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                row["health"] = f"{type(exc).__name__}"
            if row["health"] != 200:
                failures.append(row)
            samples.append(row)
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass


async def wait_idle(url: str) -> dict:
    deadline = time.monotonic() + IDLE_TIMEOUT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            state = await server_state(session, url)
            idle = (state["num_running_reqs"], state["num_queue_reqs"], state["num_used_tokens"],
                    state["num_pending_http_requests"]) == (0, 0, 0, 0)
            if idle or time.monotonic() > deadline:
                return {**state, "pool_empty": idle}
            await asyncio.sleep(0.5)


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) in MB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t, mean_y = sum(t for t, _ in points) / n, sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 60.0 * sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


def _series(samples: list[dict], since: float) -> dict[str, list[tuple[float, float]]]:
    kept = [s for s in samples if s["t"] >= since]
    return {"front_end_mb": [(s["t"], s["front_end_mb"]) for s in kept],
            "scheduler_mb": [(s["t"], s["scheduler_mb"]) for s in kept],
            "total_mb": [(s["t"], s["front_end_mb"] + s["scheduler_mb"]) for s in kept]}


def rss_summary(samples: list[dict], duration: float) -> dict:
    """RSS after warm-up: start, end, max and the least-squares slope of each process, over the whole loaded
    window and over its second half. A leak grows at a steady rate throughout; caches that fill up (the model
    kernels' per-shape primitives) flatten out, so flatness is judged on the second half."""
    warmup = min(0.2 * duration, 300.0)
    summary: dict = {"warmup_s": round(warmup, 1)}
    for window, since in (("after_warmup", warmup), ("second_half", duration / 2)):
        summary[window] = {
            key: {"start": round(points[0][1], 1), "end": round(points[-1][1], 1),
                  "max": round(max(y for _, y in points), 1), "slope_mb_per_min": round(slope_per_minute(points), 3)}
            for key, points in _series(samples, since).items()
        }
    late = _series(samples, duration / 2)["total_mb"]
    window_min = (late[-1][0] - late[0][0]) / 60
    # NOTE: flat = the fitted growth over the second half stays under 5% of its starting RSS.
    summary["flat"] = slope_per_minute(late) * window_min < 0.05 * late[0][1]
    return summary


def log_problems(log: Path) -> dict:
    counts = {name: 0 for name in LOG_PROBLEMS}
    examples: list[str] = []
    with open(log, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            for name, pattern in LOG_PROBLEMS.items():
                if pattern.search(line):
                    counts[name] += 1
                    if len(examples) < 10:
                        examples.append(line.strip()[:300])
    return {"counts": counts, "examples": examples}


# ---- the run ----

async def soak(args: argparse.Namespace, workdir: Path) -> dict:
    log = workdir / "server.log"
    flags = ("--max-total-tokens", str(args.pool), "--enable-metrics")
    server = ServerProcess.toolkit_serve(*flags, log_file=log, output_path=workdir / "serve.out")
    try:
        server.wait_healthy(STARTUP_TIMEOUT)
        calibration = await run_bench(bench_command(server.url, args, "inf", workdir / "capacity.jsonl",
                                                    num_prompts="48", warmup_requests="2"))
        capacity = calibration["request_throughput"]
        rate = args.overload * capacity
        print(f"capacity {capacity:.2f} req/s; loading at {rate:.2f} req/s for {args.duration:.0f} s", flush=True)
        stop, samples, failures, counts, chaos_errors = asyncio.Event(), [], [], dict.fromkeys(CHAOS_KINDS, 0), []
        interval = args.sample_interval or min(10.0, max(1.0, args.duration / 120))
        watchers = [asyncio.ensure_future(sample(server, interval, stop, samples, failures)),
                    asyncio.ensure_future(chaos(server.url, server.port, args.chaos_rate, stop, counts, chaos_errors))]
        load = await run_bench(bench_command(server.url, args, f"{rate:.3f}", workdir / "load.jsonl",
                                             duration=str(args.duration), warmup_requests="0",
                                             request_timeout=str(args.request_timeout)))
        stop.set()
        await asyncio.gather(*watchers)
        final = await wait_idle(server.url)
        stopped = time.monotonic()
        exit_code = server.stop(timeout=30)
        stop_seconds = time.monotonic() - stopped
    finally:
        server.stop()
    errors = load.get("errors", {})
    unexpected = {kind: n for kind, n in errors.items() if kind not in EXPECTED_BENCH_ERRORS}
    problems = log_problems(log)
    rss = rss_summary(samples, args.duration)
    verdict = {
        "no_unexpected_errors": not unexpected and not chaos_errors,
        "health_every_sample": not failures,
        "no_log_problems": not any(problems["counts"].values()),
        "pool_empty_at_end": final["pool_empty"] and final["memory_leak_detected"] is False,
        "every_chaos_kind_ran": all(counts.values()),
        "rss_flat": rss["flat"],
        "sigterm_exit_0": exit_code == 0,
    }
    return {
        "workload": {"duration_s": args.duration, "pool_tokens": args.pool, "input_len": args.input_len,
                     "output_len": args.output_len, "capacity_req_s": round(capacity, 3),
                     "rate_req_s": round(rate, 3), "request_timeout_s": args.request_timeout,
                     "chaos_rate_req_s": args.chaos_rate},
        "requests": {"bench_sent": load["num_requests"], "bench_completed": load["completed"],
                     "bench_errors_by_kind": errors, "unexpected_bench_errors": unexpected,
                     "chaos_by_kind": counts, "chaos_errors": chaos_errors[:20],
                     "total": load["num_requests"] + sum(counts.values())},
        "latency": {key: load.get(key) for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_e2e_latency_ms")},
        "rss": rss,
        "health": {"samples": len(samples), "failures": failures[:20],
                   "max_health_ms": max((s.get("health_ms", 0.0) for s in samples), default=None)},
        "log": problems,
        "final_state": final,
        "shutdown": {"exit_code": exit_code, "seconds": round(stop_seconds, 2)},
        "verdict": verdict,
        "passed": all(verdict.values()),
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="toolkit-soak-") as folder:
        result = asyncio.run(soak(args, Path(folder)))
    record = {**provenance("benchmarks.soak", argv), **result}
    if args.save:
        print(f"wrote {write_result('soak_cpu', record)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    summary = {key: record[key] for key in ("requests", "rss", "log", "final_state", "shutdown", "verdict")}
    print(json.dumps({**summary, "log": summary["log"]["counts"]}, indent=2))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
