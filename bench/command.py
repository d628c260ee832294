"""`toolkit bench` end to end: validate flags, prepare the target and workload, run each rate, write records."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolkit.bench import eventloop
from toolkit.bench.arrivals import ARRIVALS
from toolkit.bench.backends import ALIASES, BACKENDS, CHAT_BACKENDS
from toolkit.bench.benchmark import Measurement, RunSettings, Target, measure
from toolkit.bench.datasets import DATASETS, DatasetError, DatasetSpec
from toolkit.bench.max_rate import DEFAULT_ATTAINMENT, DEFAULT_RUNS, Bracket, SearchSettings, find_max_rate, meets_slo
from toolkit.bench.options import (
    UsageError,
    WorkerError,
    parse_extra_body,
    parse_json_schema,
    parse_rates,
    parse_slo,
)
from toolkit.bench.output import append_record, print_summary
from toolkit.bench.assemble import build_record
from toolkit.bench.stats import repeat_summary
from toolkit.bench.sweep import Step, sweep
from toolkit.bench.target import TargetError, resolve_model
from toolkit.bench.timeline import DEFAULT_SLICE_SECONDS
from toolkit.bench.workload import LoadSpec, Workload, build_workload


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Every `toolkit bench` flag, as typed by the user (rates, SLOs and the extra body still as text)."""

    base_url: str
    backend: str = "sglang"
    api_key: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    extra_request_body: str | None = None
    json_schema: Path | None = None
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    rate: str | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration: float | None = None
    turns: int = 1
    think_time: float = 0.0
    sweep: bool = False
    find_max_rate: bool = False
    slo_attainment: float = DEFAULT_ATTAINMENT
    search_runs: int = DEFAULT_RUNS
    repeats: int = 1
    early_stop: bool = True
    max_concurrency: int | None = None
    warmup_requests: int = 1
    request_timeout: float | None = None
    ignore_eos: bool | None = None
    slo: tuple[str, ...] = ()
    scrape_metrics: bool = False
    scrape_interval: float = 1.0
    slice_seconds: float = DEFAULT_SLICE_SECONDS
    server_log: str | None = None
    output_file: Path | None = None
    output_details: bool = False
    progress: bool = True
    workers: int = 1
    ray_address: str | None = None


def check_options(opts: BenchOptions) -> None:
    """Raises `UsageError` for flags that cannot work together or values out of range (no I/O)."""
    choices = (("--backend", opts.backend, BACKENDS), ("--dataset", opts.dataset.name, DATASETS),
               ("--arrival", opts.arrival, ARRIVALS))
    for flag, value, allowed in choices:
        if value not in allowed:
            raise UsageError(f"{flag} {value!r}: choose one of {', '.join(allowed)}")
    if not opts.base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {opts.base_url!r}: must start with http:// or https://")
    if opts.dataset.path is not None and not opts.dataset.path.is_file():
        raise UsageError(f"--dataset-path {opts.dataset.path}: no such file")
    if opts.sweep and opts.rate is not None:
        raise UsageError("--sweep finds its own rates; drop --rate")
    if opts.find_max_rate:
        _check_search(opts)
    if opts.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {opts.repeats}")
    if opts.num_prompts is not None and opts.duration is not None:
        raise UsageError("give --num-prompts or --duration, not both")
    positive = (("--duration", opts.duration), ("--burstiness", opts.burstiness),
                ("--request-timeout", opts.request_timeout), ("--scrape-interval", opts.scrape_interval),
                ("--slice-seconds", opts.slice_seconds),
                ("--trace-time-scale", opts.dataset.trace_time_scale))
    for flag, value in positive:
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    _check_turns(opts)
    _check_workers(opts)
    if opts.dataset.random_input_len < 1 or opts.dataset.random_output_len < 1:
        raise UsageError("--random-input-len and --random-output-len must be at least 1")
    if not 0.0 <= opts.dataset.random_range_ratio <= 1.0:
        raise UsageError(f"--random-range-ratio must be within [0, 1], got {opts.dataset.random_range_ratio}")


def _check_turns(opts: BenchOptions) -> None:
    if opts.turns < 1:
        raise UsageError(f"--turns must be at least 1, got {opts.turns}")
    if not opts.think_time >= 0:
        raise UsageError(f"--think-time must be 0 or more seconds, got {opts.think_time}")
    if opts.turns == 1:
        if opts.think_time > 0:
            raise UsageError("--think-time is the pause between a session's turns; it needs --turns 2 or more")
        return
    if opts.backend not in CHAT_BACKENDS:
        raise UsageError(f"--turns {opts.turns} sends whole conversations, which only a chat API takes: use "
                         f"--backend {' or '.join(CHAT_BACKENDS)} (not {opts.backend})")
    if opts.dataset.name == "trace":
        raise UsageError("--turns: a trace replays single requests; use a dataset of prompts for the user turns")


def _check_workers(opts: BenchOptions) -> None:
    if opts.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {opts.workers}")
    if opts.max_concurrency is not None and opts.max_concurrency < opts.workers:
        raise UsageError(f"--max-concurrency {opts.max_concurrency} is split over the workers; give at least one "
                         f"slot per worker (--workers {opts.workers})")
    if opts.ray_address is not None:
        from toolkit.bench.workers import import_ray

        import_ray()


def _check_search(opts: BenchOptions) -> None:
    if not opts.slo:
        raise UsageError("--find-max-rate needs at least one --slo bound to meet, e.g. --slo 'ttft:500'")
    if opts.sweep:
        raise UsageError("--find-max-rate and --sweep each choose their own rates; give one of them")
    if opts.rate is not None and "," in opts.rate:
        raise UsageError("--find-max-rate takes at most one --rate: the first rate to try")
    if not 0.0 < opts.slo_attainment <= 1.0:
        raise UsageError(f"--slo-attainment must be within (0, 1], got {opts.slo_attainment}")
    if opts.repeats > 1:
        raise UsageError("--find-max-rate judges each probe by one run; drop --repeats")
    if opts.search_runs < 2:
        raise UsageError(f"--search-runs must be at least 2, got {opts.search_runs}")


def _load_tokenizer(path: str | None, console: Console):
    from toolkit.runtime.model_loader.errors import ModelLoadError
    from toolkit.runtime.model_loader.tokenizer import load_tokenizer

    with console.status("loading the tokenizer"):
        try:
            return load_tokenizer(path)
        except (ModelLoadError, OSError, ValueError) as exc:
            raise UsageError(f"--tokenizer {path or '(embedded)'}: {exc}") from None


class _LiveProgress:
    """A rich progress bar that the runner's ticker refreshes a few times a second (never per request)."""

    def __init__(self, console: Console, label: str):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                            console=console, auto_refresh=False, transient=True)
        self.task = self.bar.add_task(label, total=None, detail="")

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def __call__(self, progress) -> None:
        detail = f"sent {progress.sent}  failed {progress.failed}"
        if progress.shed:
            detail += f"  shed {progress.shed}"
        self.bar.update(self.task, total=progress.total, completed=progress.done, detail=detail)
        self.bar.refresh()


def _config(opts: BenchOptions, target: Target, settings: RunSettings) -> dict:
    from toolkit.version import __version__

    spec = opts.dataset
    return {
        "tool": "toolkit bench", "version": __version__, "backend": target.backend, "base_url": target.base_url,
        "model": target.model, "tokenizer": opts.tokenizer or "embedded", "dataset_name": spec.name,
        "dataset_path": str(spec.path) if spec.path else None, "random_input_len": spec.random_input_len,
        "random_output_len": spec.random_output_len, "random_range_ratio": spec.random_range_ratio,
        "burstiness": opts.burstiness, "max_concurrency": settings.max_concurrency, "seed": spec.seed,
        "warmup_requests": settings.warmup_requests, "request_timeout": settings.request_timeout,
        "ignore_eos": target.ignore_eos, "turns": opts.turns,
        "json_schema": str(opts.json_schema) if opts.json_schema else None,
    }


@dataclass(frozen=True, slots=True)
class Prepared:
    """What every run of one command shares: the server, how each run is sent, the tokenizer and the SLOs."""

    target: Target
    settings: RunSettings
    tokenizer: object
    slo_ms: dict[str, float]


def prepare(opts: BenchOptions, console: Console, tokenizer=None) -> Prepared:
    """Checks the flags, asks the server for its model and loads the tokenizer (unless one is given)."""
    check_options(opts)
    slo_ms, extra_body = parse_slo(list(opts.slo)), parse_extra_body(opts.extra_request_body)
    model = eventloop.run(resolve_model(opts.base_url, opts.backend, opts.model, opts.api_key))
    if tokenizer is None:
        tokenizer = _load_tokenizer(opts.tokenizer, console)
        if opts.tokenizer is None and model and "smollm" not in model.lower():
            console.print(f"note: prompts are measured with the embedded SmolLM2 tokenizer, not {model}'s; "
                          "pass --tokenizer PATH to match the served model", highlight=False)
    ignore_eos = opts.dataset.synthetic if opts.ignore_eos is None else opts.ignore_eos
    target = Target(opts.base_url, opts.backend, opts.api_key, model, ignore_eos, extra_body,
                    parse_json_schema(opts.json_schema))
    settings = RunSettings(opts.request_timeout, opts.max_concurrency, opts.warmup_requests,
                           opts.scrape_metrics, opts.scrape_interval, opts.output_details)
    return Prepared(target, settings, tokenizer, slo_ms)


def measure_step(step: Step, opts: BenchOptions, prepared: Prepared, console: Console) -> dict:
    """One run at `step.rate`; returns its record (not yet printed or written)."""
    target, settings = prepared.target, prepared.settings
    load = LoadSpec(step.rate, opts.arrival, opts.burstiness, opts.num_prompts, opts.duration, opts.dataset.seed,
                    opts.turns, opts.think_time)
    if step.role == "saturation":
        load = replace(load, duration=None)
    with console.status("preparing prompts"):
        workload = build_workload(opts.dataset, prepared.tokenizer, load)
    label = f"rate {'inf' if math.isinf(workload.request_rate) else f'{workload.request_rate:g}'} req/s"
    if opts.workers > 1 or opts.ray_address:
        measured = _measure_split(opts, prepared, workload, label, console)
    elif opts.progress and console.is_terminal:
        with _LiveProgress(console, label) as live:
            measured = eventloop.run(measure(target, settings, workload, prepared.tokenizer, on_tick=live))
    else:
        sessions = f" in {len(workload.offsets)} sessions" if workload.turns > 1 else ""
        console.print(f"{label}: sending {len(workload)} requests{sessions}")
        measured = eventloop.run(measure(target, settings, workload, prepared.tokenizer))
    record = build_record(_config(opts, target, settings), measured, workload, slo_ms=prepared.slo_ms,
                          max_concurrency=settings.max_concurrency, server_log=opts.server_log,
                          details=opts.output_details, slice_seconds=opts.slice_seconds)
    if step.role in ("rate", "saturation") and not opts.find_max_rate:
        record["sweep"] = {"role": step.role, "step": step.index}
    return record


def _measure_split(opts: BenchOptions, prepared: Prepared, workload: Workload, label: str,
                   console: Console) -> Measurement:
    from toolkit.bench.workers import launcher, measure_split

    where = f"Ray tasks at {opts.ray_address}" if opts.ray_address else "processes"
    console.print(f"{label}: sending {len(workload)} requests from {opts.workers} {where}")
    with launcher(opts.workers, opts.ray_address) as launch:
        return eventloop.run(measure_split(prepared.target, prepared.settings, workload, prepared.tokenizer,
                                           opts.workers, launch))


def measure_configuration(step: Step, opts: BenchOptions, prepared: Prepared, console: Console,
                          emit: Callable[[dict], object]) -> dict:
    """`--repeats N` runs of one step, the i-th with seed + i (fresh prompts and arrivals, so no repeat is served
    from another's prefix cache). Every repeat but the last goes to `emit` at once; the last is returned with the
    `repeats` summary (means and 95 % intervals), for the caller to annotate and emit."""
    runs: list[dict] = []
    for i in range(opts.repeats):
        if runs:
            emit(runs[-1])
        seeded = replace(opts, dataset=replace(opts.dataset, seed=opts.dataset.seed + i))
        record = measure_step(step, seeded, prepared, console)
        runs.append(record)
        if opts.repeats > 1:
            record["repeat"] = {"index": i, "count": opts.repeats, "seed": seeded.dataset.seed}
        if record.get("interrupted"):
            break
    if opts.repeats > 1:
        runs[-1]["repeats"] = repeat_summary(runs)
    return runs[-1]


def _emit(record: dict, opts: BenchOptions, console: Console) -> dict:
    print_summary(console, record)
    if opts.output_file is not None:
        append_record(opts.output_file, record)
    return record


def search_max_rate(opts: BenchOptions, prepared: Prepared, console: Console,
                    on_record: Callable[[dict], object] | None = None) -> tuple[Bracket, list[dict]]:
    """`--find-max-rate`: a saturation run for the first guess (unless `--rate` gives one), then the probes.

    Each record carries `search` ({"role", "step", "meets_slo", "max_rate", "bracket_hi", "probes"}: the
    bracket so far) and goes to `on_record` as soon as it is measured; the saturation run counts against
    `--search-runs`, so the whole search stays bounded."""
    records: list[dict] = []
    emit = on_record or (lambda record: None)

    def run(step: Step) -> dict:
        record = measure_step(step, opts, prepared, console)
        record["search"] = {"role": step.role, "step": len(records),
                            "meets_slo": meets_slo(record, opts.slo_attainment)}
        records.append(record)
        return record

    def probe(rate: float) -> bool | None:
        record = run(Step(rate, "probe", len(records)))
        if record.get("interrupted"):
            emit(record)
            return None
        return record["search"]["meets_slo"]

    def annotate(bracket: Bracket) -> None:
        records[-1]["search"] |= bracket.as_record()
        emit(records[-1])

    if opts.rate is not None:
        start = parse_rates(opts.rate)[0]
    else:
        first = run(Step(math.inf, "saturation", 0))
        emit(first)
        start = first.get("request_throughput") or 0.0
        if first.get("interrupted") or not start > 0:
            return Bracket(), records
    bracket = find_max_rate(probe, start, SearchSettings(max_runs=opts.search_runs - len(records)), annotate)
    return bracket, records


def _search_line(bracket: Bracket, opts: BenchOptions) -> str:
    slo = " ".join(opts.slo)
    if bracket.lo is None:
        tried = ", ".join(f"{rate:.3g}" for rate, _ in bracket.probes) or "none"
        return f"no rate met the SLOs ({slo}) in {len(bracket.probes)} probe(s); rates tried: {tried} req/s"
    upper = f"{bracket.hi:.3g}" if bracket.hi is not None else "not found"
    return (f"highest rate meeting the SLOs ({slo}, attainment >= {opts.slo_attainment:g}): {bracket.lo:.3g} req/s "
            f"(lowest failing rate: {upper}; {len(bracket.probes)} probe(s))")


def run(opts: BenchOptions, console: Console | None = None) -> int:
    """Runs the command; returns the exit code (2 usage error, 1 every request failed, 130 Ctrl-C, else 0)."""
    console = console or Console()
    opts = replace(opts, backend=ALIASES.get(opts.backend, opts.backend))
    try:
        rates = parse_rates(opts.rate) if opts.rate is not None else None
        prepared = prepare(opts, console)
        if opts.find_max_rate:
            bracket, records = search_max_rate(opts, prepared, console, lambda r: _emit(r, opts, console))
            console.print(_search_line(bracket, opts), highlight=False)
        else:
            records = []

            def emit(record: dict) -> None:
                records.append(_emit(record, opts, console))

            sweep(lambda step: measure_configuration(step, opts, prepared, console, emit), rates, opts.sweep,
                  emit, opts.early_stop)
    except (UsageError, DatasetError, TargetError, ValueError) as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except WorkerError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 1
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]stopped[/]")
        return 130
    if opts.output_file is not None:
        console.print(f"appended {len(records)} record(s) to {opts.output_file}")
    if any(r.get("interrupted") for r in records):
        return 130
    return 1 if all(r["completed"] == 0 for r in records) else 0
