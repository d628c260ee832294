"""Two `toolkit serve` workers behind SGLang's own router (sglang-router), on this machine's CPU.

    python -m benchmarks.router_fleet [--groups 4 --per-group 6 --prefix-words 300 --max-tokens 8] [--save]

Both workers run the embedded model (`--device cpu --dtype float32 --enable-metrics --enable-cache-report
--max-total-tokens 8192 --decode-log-interval 4`, the last so that their logs have load lines to diagnose), each
with `--log-file LOGDIR/worker-N.log`; `python -m sglang_router.launch_router --worker-urls URL0 URL1 --policy P`
fronts them. Which worker served a request is read from each worker's `sglang:num_requests_total` before and after
it (requests go one at a time). Measured:

- routes: the status of each route through the router;
- prefix affinity: `--groups` groups of `--per-group` completions, each group one long shared prefix (random words)
  and a distinct short suffix, in one shuffled order; per group the share of its requests on its majority worker,
  and the share of prompt tokens the workers served from their prefix cache; under `cache_aware`, then under
  `round_robin` on new prefixes (the caches flushed in between);
- a dead worker: worker 1 SIGKILLed (its whole process group), then `--dead-requests` completions on the prefixes
  cache_aware had put on worker 1, one at a time (status, latency, worker); how long until the router's worker list
  marks worker 1 unhealthy (its health check every `--health-check-interval` s, 3 failures); then as many again;
- `toolkit diagnose LOGDIR --format json` on the two workers' logs: each worker's verdict and the fleet findings.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import requests

from benchmarks.common import provenance, write_result
from tests.server.router_process import (NOT_INSTALLED, ROUTER_INSTALLED, Policy, RouterProcess, group_prompts,
                                         served_by)
from toolkit.tune.launcher import ServerProcess, toolkit_command

STARTUP_TIMEOUT = 300.0
WORKER_FLAGS = ("--device", "cpu", "--dtype", "float32", "--enable-metrics", "--enable-cache-report",
                "--max-total-tokens", "8192", "--decode-log-interval", "4")
ROUTES = ("/health", "/v1/models", "/generate", "/v1/completions", "/v1/chat/completions")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--per-group", type=int, default=6)
    parser.add_argument("--prefix-words", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--dead-requests", type=int, default=12)
    parser.add_argument("--health-check-interval", type=int, default=5, help="the router's, in seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/router_fleet_cpu.json")
    return parser.parse_args(argv)


def start_workers(logdir: Path, workdir: Path) -> list[ServerProcess]:
    logdir.mkdir(parents=True, exist_ok=True)
    workers = [ServerProcess.toolkit_serve(*WORKER_FLAGS, log_file=logdir / f"worker-{i}.log",
                                           output_path=workdir / f"worker-{i}.out") for i in range(2)]
    try:
        for worker in workers:  # NOTE: both load at once
            worker.wait_healthy(STARTUP_TIMEOUT)
    except BaseException:
        for worker in workers:
            worker.stop()
        raise
    return workers


def completion(model: str, prompt: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def route_statuses(router: RouterProcess, model: str) -> dict[str, int]:
    bodies = {"/generate": {"text": "Hello", "sampling_params": {"max_new_tokens": 4}},
              "/v1/completions": completion(model, "Hello", 4),
              "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": "Hello"}],
                                       "max_tokens": 4}}
    return {route: (router.post(route, bodies[route]) if route in bodies
                    else requests.get(f"{router.url}{route}", timeout=60)).status_code for route in ROUTES}


def affinity(router: RouterProcess, urls: list[str], model: str, prompts: list[tuple[int, str]],
             max_tokens: int) -> dict:
    served: dict[int, list[int | None]] = {}
    prompt_tokens = cached_tokens = failed = 0
    for group, prompt in prompts:
        response, worker = served_by(urls, lambda: router.post("/v1/completions", completion(model, prompt,
                                                                                             max_tokens)))
        failed += response.status_code != 200
        usage = response.json().get("usage", {}) if response.status_code == 200 else {}
        prompt_tokens += usage.get("prompt_tokens", 0)
        cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        served.setdefault(group, []).append(worker)
    shares = {g: Counter(ws).most_common(1)[0][1] / len(ws) for g, ws in sorted(served.items())}
    return {"served_by": {str(g): ws for g, ws in sorted(served.items())},
            "majority_share": {str(g): round(s, 3) for g, s in shares.items()},
            "mean_majority_share": round(sum(shares.values()) / len(shares), 3),
            "requests_per_worker": dict(Counter(str(w) for ws in served.values() for w in ws)),
            "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
            "cached_share": round(cached_tokens / prompt_tokens, 3) if prompt_tokens else None, "failed": failed}


def flush(urls: list[str]) -> None:
    for url in urls:
        requests.post(f"{url}/flush_cache", timeout=60).raise_for_status()


def timed_requests(router: RouterProcess, urls: list[str], model: str, prompts: list[str], max_tokens: int,
                   since: float) -> list[dict]:
    rows = []
    for prompt in prompts:
        sent = time.monotonic()
        try:
            response, worker = served_by(urls, lambda: router.post("/v1/completions",
                                                                   completion(model, prompt, max_tokens)))
            status, error = response.status_code, None if response.ok else response.text[:200]
        except requests.RequestException as exc:
            status, worker, error = None, None, repr(exc)[:200]
        rows.append({"t_since_kill_s": round(sent - since, 2), "status": status, "worker": worker,
                     "latency_s": round(time.monotonic() - sent, 2), "error": error,
                     "router_counts_worker_1_healthy": router.healthy_workers()[urls[1]]})
    return rows


def dead_worker(router: RouterProcess, workers: list[ServerProcess], model: str, prompts: list[str],
                args: argparse.Namespace) -> dict:
    urls = [w.url for w in workers]
    os.killpg(workers[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    before = timed_requests(router, urls, model, prompts, args.max_tokens, killed)
    router.wait_workers({urls[0]: True, urls[1]: False}, timeout=6 * args.health_check_interval + 60)
    # NOTE: an upper bound: the first check (after a request, then every 0.2 s) that saw worker 1 unhealthy
    noticed = next((r["t_since_kill_s"] + r["latency_s"] for r in before if not r["router_counts_worker_1_healthy"]),
                   time.monotonic() - killed)
    after = timed_requests(router, urls, model, prompts, args.max_tokens, killed)
    return {"requests_before_noticed": before, "requests_after_noticed": after,
            "answered_200_before_noticed": sum(r["status"] == 200 for r in before),
            "answered_200_after_noticed": sum(r["status"] == 200 for r in after),
            "marked_unhealthy_within_s": round(noticed, 1)}


def diagnose(logdir: Path) -> dict:
    out = subprocess.run(toolkit_command("diagnose", str(logdir), "--format", "json"), capture_output=True,
                         text=True, timeout=300)
    report = json.loads(out.stdout)
    return {"exit_code": out.returncode, "status": report["status"],
            "workers": {w["name"]: w["diagnosis"]["verdict"]["text"] for w in report["workers"]},
            "fleet_findings": [f"{f['severity']}: {f['title']}" for f in report["fleet_findings"]]}


def fleet(args: argparse.Namespace, workdir: Path) -> dict:
    logdir = workdir / "logs"
    rng = random.Random(args.seed)
    workers = start_workers(logdir, workdir)
    urls = [w.url for w in workers]
    model = requests.get(f"{urls[0]}/v1/models", timeout=60).json()["data"][0]["id"]
    check = ("--health-check-interval-secs", str(args.health_check_interval))
    prompts = {p: group_prompts(args.groups, args.per_group, args.prefix_words, rng)
               for p in ("cache_aware", "round_robin")}
    record: dict = {"worker_flags": list(WORKER_FLAGS), "router_flags": list(check), "affinity": {}}
    try:
        policy: Policy
        for policy in ("round_robin", "cache_aware"):  # NOTE: cache_aware last: its router sees the dead worker
            flush(urls)
            router = RouterProcess(urls, workdir / f"router-{policy}.out", policy, *check)
            try:
                router.wait_workers({url: True for url in urls}, timeout=60)
                record.setdefault("routes", {})[policy] = route_statuses(router, model)
                record["affinity"][policy] = affinity(router, urls, model, prompts[policy], args.max_tokens)
                if policy == "cache_aware":
                    record["dead_worker"] = dead_worker(router, workers, model,
                                                       _on_worker_1(record["affinity"][policy], prompts[policy],
                                                                    args.dead_requests), args)
            finally:
                router.stop()
    finally:
        for worker in workers:
            worker.stop()
    record["diagnose"] = diagnose(logdir)
    return record


def _on_worker_1(result: dict, prompts: list[tuple[int, str]], count: int) -> list[str]:
    """`count` new prompts on the prefixes whose group cache_aware put on worker 1 (all groups when none)."""
    groups = {int(g) for g, ws in result["served_by"].items() if Counter(ws).most_common(1)[0][0] == 1}
    prefixes = {g: p.rsplit("\n", 1)[0] for g, p in prompts if not groups or g in groups}
    ordered = sorted(prefixes.items())
    return [f"{ordered[i % len(ordered)][1]}\nAfter the kill, request {i}: what comes next?" for i in range(count)]


def print_table(record: dict) -> None:
    print("route through the router      " + "  ".join(record["routes"]))
    for route in ROUTES:
        print(f"  {route:<27} " + "  ".join(f"{statuses[route]:<11}" for statuses in record["routes"].values()))
    print("policy        majority share per group      mean   cached prompt tokens   requests per worker")
    for policy, result in record["affinity"].items():
        shares = " ".join(f"{s:.2f}" for s in result["majority_share"].values())
        print(f"  {policy:<11} {shares:<29} {result['mean_majority_share']:.2f}   {result['cached_share']:<21}"
              f"  {result['requests_per_worker']}")
    dead = record["dead_worker"]
    n = len(dead["requests_before_noticed"])
    print(f"dead worker: {dead['answered_200_before_noticed']}/{n} answered 200 right after the SIGKILL; the router "
          f"marked it unhealthy within {dead['marked_unhealthy_within_s']} s after the kill; then "
          f"{dead['answered_200_after_noticed']}/{n} answered 200")
    print(f"diagnose: {record['diagnose']['status']}")
    for name, verdict in record["diagnose"]["workers"].items():
        print(f"  {name}: {verdict}")
    for finding in record["diagnose"]["fleet_findings"]:
        print(f"  fleet: {finding}")


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if not ROUTER_INSTALLED:
        print(NOT_INSTALLED, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="router-fleet-") as tmp:
        record = fleet(args, Path(tmp))
    from importlib.metadata import version

    record["provenance"] = provenance("benchmarks.router_fleet", list(argv), sglang_router=version("sglang-router"))
    record["config"] = {k: v for k, v in vars(args).items() if k != "save"}
    print_table(record)
    if args.save:
        print(f"wrote {write_result('router_fleet_cpu', record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
