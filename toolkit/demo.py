"""`toolkit demo`: the tuning guide's story on the embedded model, in one command.

A deliberately mistuned server — a small KV pool (2048 tokens, contexts capped to fit it, as on a small GPU) with
`--schedule-conservativeness 2` — serves chat clients that allow 512 tokens per answer but stop at the end of its
first line (~30 tokens). Admission reserves room for every request's whole `max_tokens`, so token usage stays low
while requests queue. `toolkit tune` launches it, loads it, diagnoses the log, applies the advice (lower the
conservativeness), re-measures, keeps or reverts, and goes on until nothing actionable is left or the budget is
spent. It ends with the tune page (the
objective per step and its evidence), the `toolkit report` page of the best configuration, and the command that
got there. Every server is stopped on any exit, Ctrl-C included.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console  # imported where used: `toolkit` imports this module for every command

QUESTIONS = (
    "What is the capital of France?", "Name three primary colors.", "What is 7 times 8?",
    "Translate 'thank you' into Spanish.", "What is the boiling point of water in Celsius?",
    "How many days are in a week?", "What planet is known as the red planet?", "What is the largest ocean on Earth?",
    "Name a fruit that is yellow.", "What gas do plants absorb from the air?", "What is the opposite of cold?",
    "How many legs does a spider have?", "What is the chemical symbol for gold?", "Which animal says moo?",
    "What is 15 plus 27?", "Name the first month of the year.", "Which continent is Egypt in?",
    "Name a mammal that can fly.", "What is the capital of Japan?", "What is the tallest mountain in the world?",
    "Who painted the Mona Lisa?", "What is the capital of Italy?", "How many continents are there?",
    "What is the main ingredient of guacamole?", "What is the currency of the United Kingdom?",
    "What is the largest planet in our solar system?", "How many sides does a triangle have?",
    "What is the freezing point of water in Celsius?", "What is the capital of Canada?",
    "Name a vegetable that is orange.", "What instrument has 88 keys?", "What is H2O commonly called?",
    "How many minutes are in an hour?", "What is the capital of Germany?", "Which season comes after winter?",
    "Name a shape with four equal sides.", "What is the capital of Spain?", "What do you call a baby cat?",
    "Which organ pumps blood through the body?", "What is 100 divided by 4?",
    "Name the star at the center of our solar system.", "What is the capital of Australia?",
)
MISTUNED = "--max-total-tokens 2048 --context-length 2048 --schedule-conservativeness 2"
MAX_TOKENS = 512
STOP = {"stop": ["\n"]}  # each answer ends with its first line


FULL_LOAD = (42, 3)  # chat requests per run, runs per configuration
# A CPU without native bf16 GEMMs (AVX2) serves the float32 model several times slower: the same story with half the
# requests and two runs fits several tuning steps into the time budget (measured on a 2-core AVX2 EPYC: the full
# load's first step alone took 287 s of the 420).
LIGHT_LOAD = (21, 2)


def default_load(device: str) -> tuple[int, int]:
    """(requests per run, runs per configuration) for this machine."""
    import torch

    from toolkit.runtime import cpu_capability

    on_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return FULL_LOAD if on_cuda or cpu_capability.probe().onednn_bf16 else LIGHT_LOAD


@dataclass(frozen=True)
class DemoSettings:
    out_dir: Path
    num_prompts: int = 42
    repeats: int = 3
    max_steps: int = 4
    max_time: float = 420.0
    device: str = "auto"


def _write_prompts(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS), encoding="utf-8")
    return path


def tune_options(settings: DemoSettings):
    from toolkit.bench.command import BenchOptions
    from toolkit.bench.datasets import DatasetSpec
    from toolkit.tune.flags import Flags
    from toolkit.tune.session import TuneOptions

    prompts = _write_prompts(settings.out_dir / "prompts.jsonl")
    spec = DatasetSpec(name="custom", path=prompts, sharegpt_output_len=MAX_TOKENS)
    workload = BenchOptions(base_url="http://127.0.0.1:0", backend="openai-chat", dataset=spec,
                            num_prompts=settings.num_prompts, ignore_eos=False,
                            extra_request_body=json.dumps(STOP), warmup_requests=2, progress=False)
    device = [] if settings.device == "auto" else ["--device", settings.device]
    return TuneOptions(workload, "throughput", Flags.parse([*device, *MISTUNED.split()]), repeats=settings.repeats,
                       max_steps=settings.max_steps, max_time=settings.max_time, out_dir=settings.out_dir,
                       title="toolkit demo: tuning SmolLM2-135M-Instruct from a mistuned start")


def _best_report(outcome, out_dir: Path) -> Path | None:
    """The `toolkit report` page of the best configuration: its bench runs beside its server log."""
    from toolkit.reports.build import build_report

    best = outcome.result.best
    if best is None or not best.trial.records or best.trial.folder is None:
        return None
    log = Path(best.trial.folder) / "server.log"
    title = f"toolkit demo: the tuned server (step {best.index}: {best.flags.text()})"
    return build_report(list(best.trial.records), log if log.is_file() else None, out_dir / "report.html", title)


def _story(console: Console, settings: DemoSettings) -> None:
    console.rule("[bold]toolkit demo: the tuning guide as a closed loop")
    console.print(
        f"Start: toolkit serve {MISTUNED} — a small KV pool and a cautious scheduler.\n"
        f"Load: {settings.num_prompts} chat requests at once, max_tokens {MAX_TOKENS}, each answer stopping at the "
        "end of its first line (~30 tokens), so admission reserves far more than requests use.\n"
        f"Loop: launch → load ({settings.repeats} runs) → diagnose → apply the most severe finding's flag → "
        f"keep it only if output tok/s beats the noise; at most {settings.max_steps} steps, {settings.max_time:.0f} s.",
        highlight=False)


class DemoFailed(RuntimeError):
    """Nothing was tuned (the mistuned start never ran, e.g. the server could not start here): the reason."""


def run_demo(settings: DemoSettings, console: Console | None = None) -> Path | None:
    """Runs the story; returns the tune page's path. No server outlives this call."""
    from rich.console import Console

    from toolkit.tune.session import run_tune

    console = console or Console()
    began = time.monotonic()
    _story(console, settings)
    outcome = run_tune(tune_options(settings), console)
    if outcome.result.best is None and outcome.result.reason != "stopped by Ctrl-C":
        raise DemoFailed(outcome.result.reason)
    report = _best_report(outcome, settings.out_dir)
    info = outcome.summary
    console.rule("[bold]toolkit demo done")
    if info["start"] and info["best"]:
        gain = f"{info['gain']:+.0%}" if info["gain"] is not None else "n/a"
        console.print(f"output throughput: {info['start']['mean']:.1f} tok/s at the start → "
                      f"{info['best']['mean']:.1f} tok/s after tuning ({gain}), {info['steps']} steps, "
                      f"{time.monotonic() - began:.0f} s", highlight=False)
        console.print(f"the command that got there: {info['best']['command']}", highlight=False, soft_wrap=True)
    if report is not None:
        console.print(f"report of the tuned server: {report.resolve()}", highlight=False, soft_wrap=True)
    if outcome.html_path is not None:
        console.print(f"tune page: [bold]{outcome.html_path.resolve()}[/]", highlight=False, soft_wrap=True)
    if outcome.result.reason == "stopped by Ctrl-C":
        raise KeyboardInterrupt
    return outcome.html_path


def demo(
    out: Path = typer.Option(Path("toolkit-out/demo"), "--out", help="Folder for the logs, tune steps and pages."),
    num_prompts: int = typer.Option(None, "--num-prompts", min=1, help="Chat requests per run (default: 42 on a GPU "
                                    "or a CPU with native bf16 GEMMs, 21 elsewhere)."),
    repeats: int = typer.Option(None, "--repeats", min=1, help="Runs per configuration (default: 3, or 2 where "
                                "--num-prompts defaults to 21)."),
    max_steps: int = typer.Option(4, "--max-steps", min=0, help="Most configurations to try after the start."),
    max_time: float = typer.Option(420.0, "--max-time", help="Seconds of tuning; no step starts past it."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if present, else CPU), cpu or cuda."),
) -> None:
    """Tune the embedded model's server from a mistuned start and show the gain, step by step."""
    from rich.console import Console

    console = Console()
    try:
        load = (num_prompts, repeats) if num_prompts and repeats else default_load(device)
        settings = DemoSettings(out, num_prompts or load[0], repeats or load[1], max_steps, max_time, device)
        run_demo(settings, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every server was stopped[/]")
        raise typer.Exit(130) from None
    except (RuntimeError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
