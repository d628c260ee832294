"""The `toolkit bench` command line: flags only; the work happens in `bench.command` (imported on use).

The workload flags it shares with `toolkit tune` are declared in `bench.workload_options`; the rest are bench's own.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from toolkit.bench.workload_options import LOAD, OUTPUT, TARGET, workload_flags

if TYPE_CHECKING:
    from toolkit.bench.command import BenchOptions


@workload_flags()
def bench(
    *,
    base_url: str = typer.Option(None, help="Server URL (default: http://HOST:PORT).", rich_help_panel=TARGET),
    host: str = typer.Option("127.0.0.1", help="Server host when --base-url is not given.", rich_help_panel=TARGET),
    port: int = typer.Option(30000, help="Server port when --base-url is not given.", rich_help_panel=TARGET),
    workload: BenchOptions,  # the shared workload flags, parsed
    turns: int = typer.Option(1, help="Multi-turn chat (--backend openai-chat): each arrival starts a session of "
                                       "this many turns, each sending the conversation so far with the server's "
                                       "real replies; --rate and --num-prompts then count sessions.",
                              rich_help_panel=LOAD),
    think_time: float = typer.Option(0.0, help="Seconds a session waits after a reply before its next turn.",
                                     rich_help_panel=LOAD),
    sweep: bool = typer.Option(False, help="Find the saturation throughput (rate inf), then run at 25/50/75/90% "
                                           "of it.", rich_help_panel=LOAD),
    find_max_rate: bool = typer.Option(False, help="Find the highest rate whose run meets every --slo bound "
                                                   "(bracketing, then bisection; --rate is the first guess).",
                                       rich_help_panel=LOAD),
    repeats: int = typer.Option(1, min=1, help="Run each rate N times, the i-th with --seed + i, and report each "
                                               "metric's mean and 95% confidence interval.", rich_help_panel=LOAD),
    early_stop: bool = typer.Option(True, help="--sweep or a rate list: skip the higher rates once a run shows the "
                                               "server past saturation (TTFT growing, completions behind).",
                                    rich_help_panel=LOAD),
    workers: int = typer.Option(1, min=1, help="Processes that send the load: the schedule is computed once and "
                                               "worker i sends every N-th arrival at its exact time, all from one "
                                               "shared start; the record merges every request's samples (per-worker "
                                               "rates in per_worker). --max-concurrency is split among them. 1: this "
                                               "process alone.", rich_help_panel=LOAD),
    ray_address: str = typer.Option(None, help="Run the --workers as Ray tasks on this existing cluster "
                                               "(ray.init(address=...), e.g. 10.0.0.5:6379 or auto); needs "
                                               "pip install 'toolkit\\[ray]'.", rich_help_panel=LOAD),
    scrape_metrics: bool = typer.Option(False, help="Sample the server's /metrics during the run.",
                                        rich_help_panel=OUTPUT),
    scrape_interval: float = typer.Option(1.0, help="Seconds between /metrics samples.", rich_help_panel=OUTPUT),
    slice_seconds: float = typer.Option(10.0, help="Width of the time slices each record reports (rates, "
                                                   "throughput, TTFT/ITL p50/p99; running/queued with "
                                                   "--scrape-metrics).", rich_help_panel=OUTPUT),
    server_log: str = typer.Option(None, help="The server's log file, recorded with the run's time window.",
                                   rich_help_panel=OUTPUT),
    output_file: Path = typer.Option(None, help="Append one JSON record per run (JSONL).", rich_help_panel=OUTPUT),
    output_details: bool = typer.Option(False, help="Add one row per request to each record.",
                                        rich_help_panel=OUTPUT),
    progress: bool = typer.Option(True, help="Show a live progress bar on a terminal.", rich_help_panel=OUTPUT),
) -> None:
    """Load-test an SGLang, vLLM or OpenAI-compatible server at an exact request rate and report what it did."""
    from toolkit.bench.command import run

    options = replace(
        workload, base_url=base_url or f"http://{host}:{port}", turns=turns, think_time=think_time, sweep=sweep,
        find_max_rate=find_max_rate, repeats=repeats, early_stop=early_stop, workers=workers, ray_address=ray_address,
        scrape_metrics=scrape_metrics, scrape_interval=scrape_interval, slice_seconds=slice_seconds,
        server_log=server_log, output_file=output_file, output_details=output_details, progress=progress,
    )
    raise typer.Exit(run(options))


def bench_offline(ctx: typer.Context) -> None:
    """Offline throughput of the in-process engine (like sglang.bench_offline_throughput)."""
    from toolkit.bench.offline import main as bench_offline_main

    raise typer.Exit(bench_offline_main(ctx.args))
