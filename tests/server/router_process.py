"""SGLang's own router in front of `toolkit serve` workers, for the tests and benchmarks/router_fleet.py:
`python -m sglang_router.launch_router` on 127.0.0.1 and free ports (its Prometheus exporter too: its default port
may be taken), the router's view of its workers, which worker served a request (each worker's
`sglang:num_requests_total`, so the workers run with `--enable-metrics`), and prompts in groups that share a long
prefix (what cache-aware routing keeps together)."""
from __future__ import annotations

import importlib.util
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from toolkit.tune import launcher

ROUTER_INSTALLED = importlib.util.find_spec("sglang_router") is not None
NOT_INSTALLED = "sglang-router is not installed (pip install 'toolkit[router]')"
Policy = Literal["cache_aware", "round_robin", "random", "power_of_two"]
TIMEOUT = 60
COUNTER_SETTLE_S = 5.0
R = TypeVar("R")
WORDS = ("river stone light winter market garden engine paper silver window harbor signal forest letter castle "
         "bridge thunder copper meadow lantern valley orbit canvas ladder marble pocket anchor velvet compass "
         "island whistle furnace crystal saddle ribbon glacier tunnel feather harvest beacon quarry timber "
         "falcon cellar mirror ember pepper walnut prism ledger").split()


def router_command(worker_urls: Sequence[str], port: int, policy: Policy, *flags: str) -> list[str]:
    return [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls, "--policy", policy,
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(launcher.free_port()), *flags]


class RouterProcess(launcher.ServerProcess):
    """The router; `flags` are more of its own (`--health-check-interval-secs 1`, ...)."""

    def __init__(self, worker_urls: Sequence[str], output_path: Path, policy: Policy = "cache_aware",
                 *flags: str) -> None:
        port = launcher.free_port()
        super().__init__(router_command(worker_urls, port, policy, *flags), port, output_path)

    def healthy_workers(self) -> dict[str, bool]:
        """Worker URL → whether the router counts it healthy (its `GET /workers`)."""
        body = requests.get(f"{self.url}/workers", timeout=TIMEOUT).json()
        return {worker["url"]: worker["is_healthy"] for worker in body["workers"]}

    def wait_workers(self, expected: dict[str, bool], timeout: float) -> float:
        """Seconds until the router's worker list is `expected` (URL → healthy); raises after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise launcher.LaunchError(f"the router exited:\n{self.output_tail()}")
            try:
                if self.healthy_workers() == expected:
                    return time.monotonic() - start
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise launcher.LaunchError(f"the router's workers were not {expected} within {timeout:.0f} s:\n"
                                   f"{self.output_tail()}")

    def post(self, path: str, body: dict) -> requests.Response:
        return requests.post(f"{self.url}{path}", json=body, timeout=TIMEOUT)


def requests_served(worker_url: str) -> float | None:
    """The worker's finished requests (`sglang:num_requests_total`); None when it does not answer."""
    try:
        text = requests.get(f"{worker_url}/metrics", timeout=TIMEOUT).text
    except requests.ConnectionError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "sglang:num_requests":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError(f"{worker_url}/metrics has no sglang:num_requests_total (is --enable-metrics on?)")


def served_by(worker_urls: Sequence[str], send: Callable[[], R]) -> tuple[R, int | None]:
    """`send()`'s result and the index of the one worker whose finished-request counter went up by one (None when
    none did, as for a refused request). Requests must go one at a time."""
    before = [requests_served(url) for url in worker_urls]
    result = send()
    deadline = time.monotonic() + COUNTER_SETTLE_S
    while True:
        grown = [i for i, (url, was) in enumerate(zip(worker_urls, before))
                 if was is not None and (now := requests_served(url)) is not None and now > was]
        if grown or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(grown) <= 1, f"requests went to workers {grown} at once"
    return result, grown[0] if grown else None


def group_prompts(groups: int, per_group: int, words: int, rng: random.Random) -> list[tuple[int, str]]:
    """(group, prompt) in one shuffled order: each group a shared prefix of `words` random words, each prompt its
    own short suffix."""
    prefixes = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(groups)]
    prompts = [(g, f"{prefixes[g]}\nQuestion {i} of group {g}: what comes next?")
               for g in range(groups) for i in range(per_group)]
    rng.shuffle(prompts)
    return prompts
