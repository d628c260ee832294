"""`toolkit tune` end to end: check the options, wire the launcher, workload and doctor into the loop, show it
live, write `tune.jsonl`, `summary.json` and `tune.html`, and print the best launch command (on Ctrl-C too)."""
from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from toolkit.bench.command import BenchOptions, check_options
from toolkit.bench.options import UsageError, parse_extra_body, parse_rates, parse_slo
from toolkit.diagnose.vocabulary import ENGINES, IDEAS, Engine, knob
from toolkit.tune.experiment import Doctor, Experiment, Launcher, Workload
from toolkit.tune.flags import Flags
from toolkit.tune.journal import append_step, step_entry, summary
from toolkit.tune.launch import CommandLauncher
from toolkit.tune.live import LiveView
from toolkit.tune.loop import Result, Settings, Step, Tuner
from toolkit.tune.objective import OBJECTIVES, UNITS, NoiseRule, needs_slo


@dataclass(frozen=True, slots=True)
class TuneOptions:
    workload: BenchOptions
    objective: str = "throughput"
    start: Flags = field(default_factory=Flags)
    launch: str | None = None
    engine: Engine = "sglang"
    repeats: int = 2
    max_steps: int = 8
    max_time: float | None = None
    noise: NoiseRule = NoiseRule()
    health_timeout: float = 600.0
    out_dir: Path = Path("toolkit-out/tune")
    title: str | None = None
    knobs: tuple[str, ...] = ()  # ideas or the engine's flags; empty: every knob the diagnosis names


@dataclass(slots=True)
class Outcome:
    result: Result
    summary: dict
    steps_path: Path
    summary_path: Path
    html_path: Path | None

    @property
    def exit_code(self) -> int:
        if self.result.reason == "stopped by Ctrl-C":
            return 130
        return 0 if self.result.best is not None else 1


def check_tune_options(opts: TuneOptions) -> None:
    """Raises `UsageError` for options that cannot work, before anything is launched."""
    if opts.objective not in OBJECTIVES:
        raise UsageError(f"--objective {opts.objective!r}: choose one of {', '.join(OBJECTIVES)}")
    if opts.engine not in ENGINES:
        raise UsageError(f"--engine {opts.engine!r}: choose one of {', '.join(ENGINES)}")
    if needs_slo(opts.objective) and not opts.workload.slo:
        raise UsageError(f"--objective {opts.objective} needs --slo bounds, e.g. --slo 'ttft:500 tpot:50'")
    if opts.repeats < 1 or opts.max_steps < 0:
        raise UsageError("--repeats must be at least 1 and --max-steps at least 0")
    if opts.max_time is not None and not opts.max_time > 0:
        raise UsageError(f"--max-time must be positive, got {opts.max_time}")
    if opts.workload.sweep or opts.workload.find_max_rate:
        raise UsageError("tune picks how to load the server from --objective: drop --sweep / --find-max-rate")
    if opts.workload.rate is not None and len(parse_rates(opts.workload.rate)) > 1:
        raise UsageError("tune measures one rate: give --rate a single number")
    knob_ideas(opts.knobs, opts.engine)
    parse_slo(list(opts.workload.slo))
    parse_extra_body(opts.workload.extra_request_body)
    check_options(opts.workload)


def knob_ideas(knobs: tuple[str, ...], engine: Engine) -> frozenset[str] | None:
    """`--knobs` as tuning ideas: each an idea's name (`running_cap`) or the engine's flag for it
    (`--max-running-requests`); None when no knob is named (every knob may move)."""
    if not knobs:
        return None
    by_flag = {found.flag: name for name in IDEAS if (found := knob(name, engine)) is not None}
    ideas = set()
    for named in knobs:
        idea = named if named in IDEAS else by_flag.get(named)
        if idea is None:
            raise UsageError(f"--knobs {named!r} is no tuning idea or {engine} flag; ideas: {', '.join(IDEAS)}")
        ideas.add(idea)
    return frozenset(ideas)


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_tune(opts: TuneOptions, console: Console | None = None, *, launcher: Launcher | None = None,
             workload: Workload | None = None, doctor: Doctor | None = None) -> Outcome:
    """Tunes; the keyword arguments replace the real launcher, bench workload and log doctor (tests)."""
    console = console or Console()
    check_tune_options(opts)
    if workload is None:
        from toolkit.tune.workload import BenchWorkload

        workload = BenchWorkload(opts.workload, opts.objective, opts.engine)
    if doctor is None:
        from toolkit.tune.doctor import LogDoctor

        doctor = LogDoctor()
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    steps_path = opts.out_dir / "tune.jsonl"
    steps_path.write_text("")
    launcher = launcher or CommandLauncher(opts.launch, opts.health_timeout)
    command_of = getattr(launcher, "display", lambda flags: flags.text())
    view = LiveView(console, opts.objective)
    experiment = Experiment(launcher, workload, doctor, opts.repeats, opts.out_dir, on_event=view.activity)

    def on_step(step: Step, best: Step) -> None:
        append_step(steps_path, step_entry(step, opts.objective, command_of(step.flags)))
        view.step(step, best)

    settings = Settings(opts.engine, opts.noise, opts.max_steps, opts.max_time, knob_ideas(opts.knobs, opts.engine),
                        opts.objective)
    with _sigterm_as_ctrl_c(), view:
        result = Tuner(experiment, settings, on_step).run(opts.start)
    best_command = command_of(result.best.flags) if result.best is not None else None
    info = summary(result, opts.objective, best_command, command_of(opts.start))
    summary_path = opts.out_dir / "summary.json"
    summary_path.write_text(json.dumps(info, indent=2) + "\n")
    html = _write_page(steps_path, info, opts)
    _print_end(console, result, info, steps_path, html)
    return Outcome(result, info, steps_path, summary_path, html)


def _write_page(steps_path: Path, info: dict, opts: TuneOptions) -> Path | None:
    from toolkit.reports.tune_page import write_tune_page
    from toolkit.tune.journal import read_steps

    steps = read_steps(steps_path)
    return write_tune_page(steps, info, opts.out_dir / "tune.html", opts.title) if steps else None


def _print_end(console: Console, result: Result, info: dict, steps_path: Path, html: Path | None) -> None:
    unit = UNITS[info["objective"]]
    console.rule("[bold]toolkit tune done")
    console.print(f"stopped: {escape(result.reason)} ({len(result.steps)} launches, {result.seconds:.0f} s)",
                  highlight=False)
    start, best = info["start"], info["best"]
    if start and best:
        gain = f" ({info['gain']:+.0%})" if info["gain"] is not None else ""
        console.print(f"{info['objective']}: {start['mean']:,.1f} {unit} at the start → {best['mean']:,.1f} {unit} "
                      f"at step {best['step']}{gain}", highlight=False)
    if best:
        console.print("best launch command:", style="bold")
        console.print(escape(best["command"]), highlight=False, soft_wrap=True)
    console.print(f"steps: {steps_path}" + (f" · page: {html.resolve()}" if html else ""), highlight=False,
                  soft_wrap=True)
