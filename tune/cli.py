"""The `toolkit tune` command line: flags only; the work happens in `tune.session` (imported on use)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from toolkit.bench.workload_options import Differences, workload_flags

if TYPE_CHECKING:
    from toolkit.bench.command import BenchOptions

_LOOP, _SERVER, _LOAD, _OUT = "Loop", "Server", "Workload (toolkit bench)", "Output"
NUM_PROMPTS = 32  # unless --duration
# NOTE: the shared workload flags (bench.workload_options) differ here, and only here: tune runs every configuration
# --repeats times for up to --max-steps steps, so its default run is short (small prompts, few requests, a shorter
# max-rate search) where bench's default is one long measurement.
# NOTE: the backend follows --engine unless given: vLLM serves no /generate, so `--engine vllm` talks openai.
BACKEND_BY_ENGINE = {"sglang": "sglang", "vllm": "openai"}
WORKLOAD_DIFFERENCES: Differences = {
    "backend": {"default": None, "help": "sglang (/generate) | openai (/v1/completions) | openai-chat "
                "(/v1/chat/completions); default: sglang, or openai with --engine vllm."},
    "random_input_len": {"default": 128},
    "random_output_len": {"default": 64},
    "random_range_ratio": {"default": 0.5},
    "search_runs": {"default": 6},
    "num_prompts": {"help": f"Requests per run (default: {NUM_PROMPTS}, unless --duration)."},
}


@workload_flags(_LOAD, WORKLOAD_DIFFERENCES)
def tune(
    *,
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
    workload: BenchOptions,  # the shared workload flags, parsed; all in the _LOAD panel
    out: Path = typer.Option(Path("toolkit-out/tune"), help="Folder for tune.jsonl, summary.json, tune.html and "
                                                           "each step's server log.", rich_help_panel=_OUT),
) -> None:
    """Tune a server's flags in a closed loop: launch, load, diagnose, change one flag, measure, keep or revert."""
    from rich.console import Console
    from rich.markup import escape

    from toolkit.bench.options import UsageError
    from toolkit.tune.flags import Flags
    from toolkit.tune.objective import NoiseRule
    from toolkit.tune.session import TuneOptions, run_tune

    num_prompts = NUM_PROMPTS if workload.num_prompts is None and workload.duration is None else workload.num_prompts
    backend = workload.backend or BACKEND_BY_ENGINE.get(engine, "sglang")
    workload = replace(workload, num_prompts=num_prompts, backend=backend, progress=False)
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
