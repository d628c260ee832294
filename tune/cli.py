"""The `toolkit tune` command line: flags only; the work happens in `tune.session` (imported on use)."""
from __future__ import annotations

from pathlib import Path

import typer

_LOOP, _SERVER, _LOAD, _OUT = "Loop", "Server", "Workload (toolkit bench)", "Output"


def tune(
    objective: str = typer.Option("throughput", help="throughput (output tok/s) | goodput (req/s meeting --slo) | "
                                                     "max-rate (highest rate meeting --slo).", rich_help_panel=_LOOP),
    repeats: int = typer.Option(2, min=1, help="Runs per configuration; the noise test compares their means.",
                                rich_help_panel=_LOOP),
    max_steps: int = typer.Option(8, min=0, help="Most configurations to try after the start.",
                                  rich_help_panel=_LOOP),
    max_time: float = typer.Option(None, help="Seconds; no step starts that would not end within it.",
                                   rich_help_panel=_LOOP),
    noise_k: float = typer.Option(2.0, help="A gain must exceed this many pooled standard errors ...",
                                  rich_help_panel=_LOOP),
    min_gain: float = typer.Option(0.03, help="... and this fraction of the best mean.", rich_help_panel=_LOOP),
    knobs: str = typer.Option("", help="Only these knobs may move: tuning ideas or the engine's flags, comma "
                                       "separated, e.g. \"running_cap,prefill_budget,admission\" (default: any "
                                       "the diagnosis names).", rich_help_panel=_LOOP),
    flags: str = typer.Option("", "--flags", help="The start's server flags, e.g. "
                                                  "\"--schedule-conservativeness 1.3 --max-running-requests 64\".",
                              rich_help_panel=_SERVER),
    launch: str = typer.Option(None, help="A serving command instead of toolkit serve, with {flags} (and "
                                          "optionally {port}, {log}): \"python -m sglang.launch_server "
                                          "--model-path M {flags}\".", rich_help_panel=_SERVER),
    engine: str = typer.Option("sglang", help="Whose flag names the advice uses: sglang (also toolkit serve) | "
                                              "vllm.", rich_help_panel=_SERVER),
    health_timeout: float = typer.Option(600.0, help="Seconds a launch may take to answer /health.",
                                         rich_help_panel=_SERVER),
    backend: str = typer.Option("sglang", help="sglang | openai | openai-chat (and SGLang's aliases).",
                                rich_help_panel=_LOAD),
    model: str = typer.Option(None, help="Model name to request.", rich_help_panel=_LOAD),
    tokenizer: str = typer.Option(None, help="Tokenizer folder or .gguf (default: the embedded SmolLM2's).",
                                  rich_help_panel=_LOAD),
    api_key: str = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer key for the server.",
                                rich_help_panel=_LOAD),
    extra_request_body: str = typer.Option(None, help="JSON object merged into every request body, e.g. "
                                                       "'{\"stop\": [\".\"]}'.", rich_help_panel=_LOAD),
    dataset: str = typer.Option("random", "--dataset", "--dataset-name", help="random | generated-shared-prefix "
                                "| sharegpt | custom | trace.", rich_help_panel=_LOAD),
    dataset_path: Path = typer.Option(None, help="File for sharegpt, custom or trace.", rich_help_panel=_LOAD),
    random_input_len: int = typer.Option(128, help="Input tokens, at most (random).", rich_help_panel=_LOAD),
    random_output_len: int = typer.Option(64, help="Output tokens, at most (random).", rich_help_panel=_LOAD),
    random_range_ratio: float = typer.Option(0.5, help="Lengths uniform on \\[ratio·L, L] (random).",
                                             rich_help_panel=_LOAD),
    sharegpt_output_len: int = typer.Option(None, min=1, help="Override output lengths of sharegpt/custom rows.",
                                            rich_help_panel=_LOAD),
    num_prompts: int = typer.Option(None, min=1, help="Requests per run (default 32 unless --duration).",
                                    rich_help_panel=_LOAD),
    duration: float = typer.Option(None, help="Seconds of arrivals per run, instead of --num-prompts.",
                                   rich_help_panel=_LOAD),
    rate: str = typer.Option(None, "--rate", "--request-rate", help="Requests/s (default inf; max-rate: the first "
                             "guess).", rich_help_panel=_LOAD),
    arrival: str = typer.Option("poisson", help="poisson | constant | gamma.", rich_help_panel=_LOAD),
    max_concurrency: int = typer.Option(None, min=1, help="Most requests in flight at once.",
                                        rich_help_panel=_LOAD),
    warmup_requests: int = typer.Option(1, min=0, help="Requests before each measured run.",
                                        rich_help_panel=_LOAD),
    seed: int = typer.Option(1, help="Seed for arrivals and synthetic prompts.", rich_help_panel=_LOAD),
    request_timeout: float = typer.Option(600.0, help="Seconds before a request counts as timed out.",
                                          rich_help_panel=_LOAD),
    ignore_eos: bool = typer.Option(None, "--ignore-eos/--no-ignore-eos", help="Force the full output length "
                                    "(default: on for synthetic data).", rich_help_panel=_LOAD),
    slo: list[str] = typer.Option([], help="SLOs in ms for goodput and max-rate, e.g. --slo 'ttft:500 tpot:50'.",
                                  rich_help_panel=_LOAD),
    slo_attainment: float = typer.Option(0.9, help="max-rate: the fraction of requests that must meet the SLOs.",
                                         rich_help_panel=_LOAD),
    search_runs: int = typer.Option(6, help="max-rate: most runs per search.", rich_help_panel=_LOAD),
    out: Path = typer.Option(Path("toolkit-out/tune"), help="Folder for tune.jsonl, summary.json, tune.html and "
                                                           "each step's server log.", rich_help_panel=_OUT),
) -> None:
    """Tune a server's flags in a closed loop: launch, load, diagnose, change one flag, measure, keep or revert."""
    from rich.console import Console
    from rich.markup import escape

    from toolkit.bench.command import BenchOptions
    from toolkit.bench.datasets import DatasetSpec
    from toolkit.bench.options import UsageError
    from toolkit.tune.flags import Flags
    from toolkit.tune.objective import NoiseRule
    from toolkit.tune.session import TuneOptions, run_tune

    spec = DatasetSpec(name=dataset, path=dataset_path, seed=seed, random_input_len=random_input_len,
                       random_output_len=random_output_len, random_range_ratio=random_range_ratio,
                       sharegpt_output_len=sharegpt_output_len)
    workload = BenchOptions(
        base_url="http://127.0.0.1:0", backend=backend, api_key=api_key, model=model, tokenizer=tokenizer,
        extra_request_body=extra_request_body, dataset=spec, rate=rate, arrival=arrival,
        num_prompts=num_prompts or (None if duration else 32), duration=duration, max_concurrency=max_concurrency,
        warmup_requests=warmup_requests,
        request_timeout=request_timeout, ignore_eos=ignore_eos, slo=tuple(slo), slo_attainment=slo_attainment,
        search_runs=search_runs, progress=False,
    )
    error = Console(stderr=True, soft_wrap=True)
    try:
        options = TuneOptions(workload, objective, Flags.parse(flags), launch, engine, repeats, max_steps, max_time,
                              NoiseRule(noise_k, min_gain), health_timeout, out,
                              knobs=tuple(k.strip() for k in knobs.split(",") if k.strip()))
        outcome = run_tune(options, Console())
    except (UsageError, ValueError) as exc:
        error.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(outcome.exit_code)
