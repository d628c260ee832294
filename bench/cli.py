"""The `toolkit bench` command line: flags only; the work happens in `bench.command` (imported on use)."""
from __future__ import annotations

from pathlib import Path

import typer

_TARGET, _LOAD, _DATA, _OUT = "Target", "Load", "Dataset", "Output"


def bench(
    base_url: str = typer.Option(None, help="Server URL (default: http://HOST:PORT).", rich_help_panel=_TARGET),
    host: str = typer.Option("127.0.0.1", help="Server host when --base-url is not given.", rich_help_panel=_TARGET),
    port: int = typer.Option(30000, help="Server port when --base-url is not given.", rich_help_panel=_TARGET),
    backend: str = typer.Option(
        "sglang", help="sglang (/generate) | openai (/v1/completions) | openai-chat (/v1/chat/completions); "
                       "SGLang's names sglang-oai, sglang-oai-chat, vllm, vllm-chat also work.",
        rich_help_panel=_TARGET),
    api_key: str = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer key for the server.",
                                rich_help_panel=_TARGET),
    model: str = typer.Option(None, help="Model name to request (default: the first of GET /v1/models).",
                              rich_help_panel=_TARGET),
    tokenizer: str = typer.Option(None, help="Tokenizer folder or .gguf (default: the embedded SmolLM2's).",
                                  rich_help_panel=_TARGET),
    extra_request_body: str = typer.Option(None, help="JSON object merged into every request body.",
                                           rich_help_panel=_TARGET),
    rate: str = typer.Option(None, "--rate", "--request-rate",
                             help="Requests/s: 8, inf (all at once) or a list 1,2,4,8 (default: inf, or the "
                                  "trace's own timestamps for --dataset trace).", rich_help_panel=_LOAD),
    arrival: str = typer.Option("poisson", help="poisson | constant | gamma.", rich_help_panel=_LOAD),
    burstiness: float = typer.Option(1.0, help="Gamma shape for --arrival gamma (1 = Poisson; <1 burstier).",
                                     rich_help_panel=_LOAD),
    num_prompts: int = typer.Option(None, min=1, help="Requests per run (default: 1000, or the dataset's size).",
                                    rich_help_panel=_LOAD),
    duration: float = typer.Option(None, help="Seconds of arrivals per run, instead of --num-prompts.",
                                   rich_help_panel=_LOAD),
    turns: int = typer.Option(1, help="Multi-turn chat (--backend openai-chat): each arrival starts a session of "
                                       "this many turns, each sending the conversation so far with the server's "
                                       "real replies; --rate and --num-prompts then count sessions.",
                              rich_help_panel=_LOAD),
    think_time: float = typer.Option(0.0, help="Seconds a session waits after a reply before its next turn.",
                                     rich_help_panel=_LOAD),
    sweep: bool = typer.Option(False, help="Find the saturation throughput (rate inf), then run at 25/50/75/90% "
                                           "of it.", rich_help_panel=_LOAD),
    find_max_rate: bool = typer.Option(False, help="Find the highest rate whose run meets every --slo bound "
                                                   "(bracketing, then bisection; --rate is the first guess).",
                                       rich_help_panel=_LOAD),
    slo_attainment: float = typer.Option(0.9, help="--find-max-rate: the fraction of requests that must meet "
                                                   "every --slo bound for a run to pass.", rich_help_panel=_LOAD),
    search_runs: int = typer.Option(8, help="--find-max-rate: most runs, the saturation run included.",
                                    rich_help_panel=_LOAD),
    repeats: int = typer.Option(1, min=1, help="Run each rate N times, the i-th with --seed + i, and report each "
                                               "metric's mean and 95% confidence interval.", rich_help_panel=_LOAD),
    early_stop: bool = typer.Option(True, help="--sweep or a rate list: skip the higher rates once a run shows the "
                                               "server past saturation (TTFT growing, completions behind).",
                                    rich_help_panel=_LOAD),
    max_concurrency: int = typer.Option(None, min=1, help="Most requests in flight at once.",
                                        rich_help_panel=_LOAD),
    workers: int = typer.Option(1, min=1, help="Processes that send the load: the schedule is computed once and "
                                               "worker i sends every N-th arrival at its exact time, all from one "
                                               "shared start; the record merges every request's samples (per-worker "
                                               "rates in per_worker). --max-concurrency is split among them. 1: this "
                                               "process alone.", rich_help_panel=_LOAD),
    ray_address: str = typer.Option(None, help="Run the --workers as Ray tasks on this existing cluster "
                                               "(ray.init(address=...), e.g. 10.0.0.5:6379 or auto); needs "
                                               "pip install 'toolkit\\[ray]'.", rich_help_panel=_LOAD),
    warmup_requests: int = typer.Option(1, min=0, help="Requests sent before the measured run.",
                                        rich_help_panel=_LOAD),
    seed: int = typer.Option(1, help="Seed for arrivals and synthetic prompts.", rich_help_panel=_LOAD),
    request_timeout: float = typer.Option(600.0, help="Seconds before a request counts as timed out.",
                                          rich_help_panel=_LOAD),
    ignore_eos: bool = typer.Option(None, "--ignore-eos/--no-ignore-eos",
                                    help="Force the full output length (default: on for random, "
                                         "generated-shared-prefix and trace).", rich_help_panel=_LOAD),
    dataset: str = typer.Option("random", "--dataset", "--dataset-name",
                                help="random | generated-shared-prefix | sharegpt | custom | trace.",
                                rich_help_panel=_DATA),
    dataset_path: Path = typer.Option(None, help="File for sharegpt (JSON), custom (JSONL) or trace (Azure CSV "
                                                 "or Mooncake JSONL); trace default: Azure 2023 conversations.",
                                      rich_help_panel=_DATA),
    random_input_len: int = typer.Option(1024, help="Input tokens, at most (random).", rich_help_panel=_DATA),
    random_output_len: int = typer.Option(1024, help="Output tokens, at most (random).", rich_help_panel=_DATA),
    random_range_ratio: float = typer.Option(0.0, help="Lengths are uniform on \\[ratio·L, L] (random).",
                                             rich_help_panel=_DATA),
    gsp_num_groups: int = typer.Option(64, min=1, help="Shared-prefix groups.", rich_help_panel=_DATA),
    gsp_prompts_per_group: int = typer.Option(16, min=1, help="Prompts per group.", rich_help_panel=_DATA),
    gsp_system_prompt_len: int = typer.Option(2048, min=0, help="Shared system prompt tokens.",
                                              rich_help_panel=_DATA),
    gsp_question_len: int = typer.Option(128, min=1, help="Per-prompt question tokens.", rich_help_panel=_DATA),
    gsp_output_len: int = typer.Option(256, min=1, help="Output tokens per prompt.", rich_help_panel=_DATA),
    sharegpt_output_len: int = typer.Option(None, min=1, help="Override output lengths of sharegpt/custom rows.",
                                            rich_help_panel=_DATA),
    trace_time_scale: float = typer.Option(1.0, help="Multiply trace inter-arrival times (0.5 = twice as fast).",
                                           rich_help_panel=_DATA),
    slo: list[str] = typer.Option([], help="Goodput SLOs in ms, e.g. --slo 'ttft:200 tpot:50 e2e:3000'.",
                                  rich_help_panel=_OUT),
    scrape_metrics: bool = typer.Option(False, help="Sample the server's /metrics during the run.",
                                        rich_help_panel=_OUT),
    scrape_interval: float = typer.Option(1.0, help="Seconds between /metrics samples.", rich_help_panel=_OUT),
    slice_seconds: float = typer.Option(10.0, help="Width of the time slices each record reports (rates, "
                                                   "throughput, TTFT/ITL p50/p99; running/queued with "
                                                   "--scrape-metrics).", rich_help_panel=_OUT),
    server_log: str = typer.Option(None, help="The server's log file, recorded with the run's time window.",
                                   rich_help_panel=_OUT),
    output_file: Path = typer.Option(None, help="Append one JSON record per run (JSONL).", rich_help_panel=_OUT),
    output_details: bool = typer.Option(False, help="Add one row per request to each record.",
                                        rich_help_panel=_OUT),
    progress: bool = typer.Option(True, help="Show a live progress bar on a terminal.", rich_help_panel=_OUT),
) -> None:
    """Load-test an SGLang, vLLM or OpenAI-compatible server at an exact request rate and report what it did."""
    from toolkit.bench.command import BenchOptions, run
    from toolkit.bench.datasets import DatasetSpec

    spec = DatasetSpec(
        name=dataset, path=dataset_path, seed=seed, random_input_len=random_input_len,
        random_output_len=random_output_len, random_range_ratio=random_range_ratio, gsp_num_groups=gsp_num_groups,
        gsp_prompts_per_group=gsp_prompts_per_group, gsp_system_prompt_len=gsp_system_prompt_len,
        gsp_question_len=gsp_question_len, gsp_output_len=gsp_output_len, sharegpt_output_len=sharegpt_output_len,
        trace_time_scale=trace_time_scale,
    )
    options = BenchOptions(
        base_url=base_url or f"http://{host}:{port}", backend=backend, api_key=api_key, model=model,
        tokenizer=tokenizer, extra_request_body=extra_request_body, dataset=spec, rate=rate, arrival=arrival,
        burstiness=burstiness, num_prompts=num_prompts, duration=duration, turns=turns, think_time=think_time,
        sweep=sweep,
        find_max_rate=find_max_rate, slo_attainment=slo_attainment, search_runs=search_runs, repeats=repeats,
        early_stop=early_stop,
        max_concurrency=max_concurrency, warmup_requests=warmup_requests, request_timeout=request_timeout,
        ignore_eos=ignore_eos, slo=tuple(slo), scrape_metrics=scrape_metrics, scrape_interval=scrape_interval,
        slice_seconds=slice_seconds, server_log=server_log, output_file=output_file, output_details=output_details,
        progress=progress, workers=workers, ray_address=ray_address,
    )
    raise typer.Exit(run(options))


def bench_offline(ctx: typer.Context) -> None:
    """Offline throughput of the in-process engine (like sglang.bench_offline_throughput)."""
    from toolkit.bench.offline import main as bench_offline_main

    raise typer.Exit(bench_offline_main(ctx.args))
