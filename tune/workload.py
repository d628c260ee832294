"""The load `tune` measures each configuration with: `toolkit bench` in-process (the tokenizer loaded once), one
run at the workload's rate for `throughput`/`goodput`, or a `--find-max-rate` search for `max-rate`.

Each run starts from an idle server: SGLang re-initializes its admission estimate (the new-token ratio) when it goes
idle, so a run that starts while the previous one's estimate still lingers would measure a different server.
"""
from __future__ import annotations

import time
from dataclasses import replace

from rich.console import Console

from toolkit.bench.command import BenchOptions, Prepared, measure_step, prepare, search_max_rate
from toolkit.bench.options import parse_rates
from toolkit.bench.sweep import Step
from toolkit.bench.target import TargetError
from toolkit.tune.experiment import RunError, Server
from toolkit.tune.objective import value_of

DROPPED_KEYS = ("requests", "scraped_metrics")
SETTLE_SECONDS = 1.0  # NOTE: longer than our scheduler's 0.5 s idle poll, so it sees an idle step between runs


class BenchWorkload:
    def __init__(self, options: BenchOptions, objective: str, console: Console | None = None):
        self.options = options
        self.objective = objective
        self.console = console or Console(quiet=True)
        self.rate = parse_rates(options.rate)[0] if options.rate is not None and objective != "max-rate" else None
        self.tokenizer = None

    def _prepared(self, server: Server) -> tuple[BenchOptions, Prepared]:
        opts = replace(self.options, base_url=server.url, server_log=str(server.log), output_file=None,
                       progress=False, output_details=False)
        try:
            prepared = prepare(opts, self.console, self.tokenizer)
        except TargetError as exc:
            raise RunError(str(exc)) from None
        self.tokenizer = prepared.tokenizer
        return opts, prepared

    def run(self, server: Server, repeat: int) -> tuple[float, list[dict]]:
        time.sleep(SETTLE_SECONDS)
        opts, prepared = self._prepared(server)
        if self.objective == "max-rate":
            bracket, records = search_max_rate(opts, prepared, self.console)
            value = bracket.lo or 0.0
        else:
            records = [measure_step(Step(self.rate, "single"), opts, prepared, self.console)]
            value = value_of(self.objective, records[0])
        records = [{k: v for k, v in r.items() if k not in DROPPED_KEYS} | {"tune_repeat": repeat} for r in records]
        if any(r.get("interrupted") for r in records):
            raise KeyboardInterrupt
        return value, records
