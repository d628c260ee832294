"""The load `tune` measures each configuration with: `toolkit bench` in-process (the tokenizer loaded once), one
run at the workload's rate for `throughput`/`goodput`, or a `--find-max-rate` search for `max-rate`.

Every repeat of a configuration starts from the same server state, so the repeats are exchangeable and the noise
rule compares like with like:
- the server's prefix cache is emptied first (`POST /flush_cache` on SGLang and `toolkit serve`,
  `POST /reset_prefix_cache` on vLLM, which serves it in its dev mode only). Without that the second repeat of the
  same prompts is served from the radix cache, runs 30-120 % faster, and the spread it creates hides real gains;
- a server that has no such endpoint gets fresh prompts instead: repeat i runs with seed + i (the same seeds for
  every configuration, so configurations stay paired);
- the run starts once the server is idle: SGLang re-initializes its admission estimate (the new-token ratio) when it
  goes idle, so a run that starts while the previous one's estimate still lingers would measure a different server.
Each record says which reset was used (`cache_reset`: "flush_cache", "reset_prefix_cache" or "fresh-seed").
"""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import replace

from rich.console import Console

from toolkit.bench.command import BenchOptions, Prepared, measure_step, prepare, search_max_rate
from toolkit.bench.options import parse_rates
from toolkit.bench.sweep import Step
from toolkit.bench.target import TargetError
from toolkit.diagnose.vocabulary import Engine
from toolkit.tune.experiment import RunError, Server
from toolkit.tune.objective import value_of

DROPPED_KEYS = ("requests", "scraped_metrics")
SETTLE_SECONDS = 1.0  # NOTE: longer than our scheduler's 0.5 s idle poll, so it sees an idle step between runs
RESET_PATHS = {"sglang": "/flush_cache", "vllm": "/reset_prefix_cache"}
RESET_TRIES = 10  # a flush is refused while requests are still draining; retry for up to ~RESET_TRIES seconds
FRESH_SEED = "fresh-seed"


def reset_prefix_cache(url: str, engine: Engine, tries: int = RESET_TRIES, timeout: float = 30.0) -> bool:
    """Empties the server's prefix cache; False when the server has no such endpoint (or never got idle)."""
    path = RESET_PATHS[engine]
    request = urllib.request.Request(url.rstrip("/") + path, data=b"", method="POST")
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return 200 <= response.status < 300
        except urllib.error.HTTPError as exc:
            if exc.code != 400:  # 404/405: no such endpoint here; 400: not idle yet (SGLang's answer), retry
                return False
        except (urllib.error.URLError, OSError):
            return False
        time.sleep(1.0)
    return False


class BenchWorkload:
    def __init__(self, options: BenchOptions, objective: str, engine: Engine = "sglang",
                 console: Console | None = None):
        self.options = options
        self.objective = objective
        self.engine = engine
        self.console = console or Console(quiet=True)
        self.rate = parse_rates(options.rate)[0] if options.rate is not None and objective != "max-rate" else None
        self.tokenizer = None

    def _prepared(self, server: Server, seed: int) -> tuple[BenchOptions, Prepared]:
        opts = replace(self.options, base_url=server.url, server_log=str(server.log), output_file=None,
                       progress=False, output_details=False, dataset=replace(self.options.dataset, seed=seed))
        try:
            prepared = prepare(opts, self.console, self.tokenizer)
        except TargetError as exc:
            raise RunError(str(exc)) from None
        self.tokenizer = prepared.tokenizer
        return opts, prepared

    def reset(self, server: Server, repeat: int) -> tuple[str, int]:
        """(how the repeat starts clean, the prompt seed it runs with)."""
        time.sleep(SETTLE_SECONDS)
        if reset_prefix_cache(server.url, self.engine):
            return RESET_PATHS[self.engine].lstrip("/"), self.options.dataset.seed
        return FRESH_SEED, self.options.dataset.seed + repeat

    def run(self, server: Server, repeat: int) -> tuple[float, list[dict]]:
        how, seed = self.reset(server, repeat)
        opts, prepared = self._prepared(server, seed)
        if self.objective == "max-rate":
            bracket, records = search_max_rate(opts, prepared, self.console)
            value = bracket.lo or 0.0
        else:
            records = [measure_step(Step(self.rate, "single"), opts, prepared, self.console)]
            value = value_of(self.objective, records[0])
        records = [{k: v for k, v in r.items() if k not in DROPPED_KEYS}
                   | {"tune_repeat": repeat, "cache_reset": how, "seed": seed} for r in records]
        if any(r.get("interrupted") for r in records):
            raise KeyboardInterrupt
        return value, records
