"""`toolkit diagnose`: the typer command. Heavy imports happen inside the command so `toolkit --help` is fast.

Several log files are one server's logs, read as one (its ranks' files, a rotated log), unless `--fleet` says each
is a worker of its own; a directory always is a fleet: each of its logs is one worker (`diagnose.fleet`).

`--html` writes the `toolkit report` page; the report lives downstream of the diagnosis, so this module never
imports it: the CLI composition root hands it the page writer with `use_html_writer`.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, List, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from toolkit.diagnose.analysis import Diagnosis
    from toolkit.diagnose.read.export import EventStash

FORMATS = ("text", "json")
FAIL_ON = ("info", "warning", "critical")
HtmlWriter = Callable[["Diagnosis", str], Path]
_html_writer: HtmlWriter | None = None


def use_html_writer(writer: HtmlWriter) -> None:
    """How `--html FILE` writes a diagnosis as one HTML page (raises ValueError with a one-line reason)."""
    global _html_writer
    _html_writer = writer


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _check_inputs(logs: list[str], fmt: str, fail_on: str | None, export: str | None, bench: str | None,
                  html: str | None) -> None:
    from toolkit.diagnose.read.source import LogError, check_log

    if not logs:
        _fail("no log given: pass one or more server log files, .gz files, or - for stdin")
    if fmt not in FORMATS:
        _fail(f"unknown --format {fmt!r}: choose text or json")
    if fail_on is not None and fail_on not in FAIL_ON:
        _fail(f"unknown --fail-on {fail_on!r}: choose info, warning or critical")
    if export is not None and not export.endswith((".csv", ".parquet")):
        _fail(f"--export needs a .csv or .parquet file name, not {export!r}")
    if html is not None and _html_writer is None:
        _fail("--html needs toolkit's report module: use `toolkit report --server-log LOG --out FILE`")
    if logs.count("-") > 1:
        _fail("stdin (-) can be read once only")
    try:
        for path in logs:
            check_log(path)
    except LogError as exc:
        _fail(str(exc))
    if bench and not os.path.isfile(bench):
        _fail(f"no such file: {bench}" if not os.path.exists(bench) else f"--bench {bench} is not a file")


def _fleet_logs(logs: list[str], fleet: bool) -> list[str] | None:
    """The worker logs when the command diagnoses a fleet (`--fleet`, or a directory given), else None."""
    if not fleet and not any(os.path.isdir(path) for path in logs):
        return None
    from toolkit.diagnose.fleet import logs_in  # NOTE: only here: it imports the analysis (the workers start first)

    if "-" in logs:
        _fail("a fleet is read from files: stdin (-) cannot be a worker's log")
    for path in logs:
        if os.path.isdir(path) and not logs_in(path):
            _fail(f"{path} is a directory, not a log file")  # NOTE: and it holds no worker log either
    workers = [str(p) for path in logs for p in (logs_in(path) if os.path.isdir(path) else [path])]
    if len(workers) < 2:
        _fail(f"a fleet needs two or more worker logs (*.log, *.log.gz, *.gz, *.txt); found {len(workers)} in "
              + ", ".join(logs))
    return workers


def _no_blas_threads() -> None:
    """One BLAS thread, unless the user set a number (`OPENBLAS_NUM_THREADS`, or `OMP_NUM_THREADS` that OpenBLAS
    reads after it; read when numpy is first imported): the analysis multiplies no matrices, and OpenBLAS's idle
    threads spin a while after they start, on a core the read's workers need (~70 ms of CPU on a 1M-line log)."""
    if "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def _check_fleet(export: str | None, metrics: str | None, bench: str | None, html: str | None) -> None:
    for name, value in (("--export", export), ("--metrics", metrics), ("--bench", bench), ("--html", html)):
        if value is not None:
            _fail(f"{name} reads one server: diagnose that worker's log alone")


def diagnose(
    logs: Optional[List[str]] = typer.Argument(None, help="Server logs (SGLang or vLLM): plain, .gz, or - for "
                                               "stdin."),
    fmt: str = typer.Option("text", "--format", help="text (a report) or json (schema toolkit.diagnose/1)."),
    plots: Optional[str] = typer.Option(None, "--plots", help="Write one timeline PNG per rank into DIR."),
    export: Optional[str] = typer.Option(None, "--export", help="Write the parsed events to FILE.csv|.parquet."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Exit 1 on a finding this severe: "
                                          "info, warning or critical."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="A Prometheus scrape (FILE or URL)."),
    bench: Optional[str] = typer.Option(None, "--bench", help="A `toolkit bench` RESULT.jsonl of the same run."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write the report as one self-contained HTML "
                                       "page to FILE (as `toolkit report`)."),
    fleet: bool = typer.Option(False, "--fleet", help="Each log is one worker (named by its file stem): diagnose "
                               "each, then compare them. Implied when a directory is given."),
) -> None:
    """Turn SGLang or vLLM server logs into evidence-backed tuning advice and plots."""
    _no_blas_threads()
    logs = list(logs or [])
    workers = _fleet_logs(logs, fleet) if logs else None
    if workers is not None:
        _check_fleet(export, metrics, bench, html)
        _check_inputs(workers, fmt, fail_on, export, bench, html)
        _run_fleet(workers, fmt, plots, fail_on)
        return
    _check_inputs(logs, fmt, fail_on, export, bench, html)
    _run(logs, fmt, plots, export, fail_on, metrics, bench, html)


def _run(logs: list[str], fmt: str, plots: str | None, export: str | None, fail_on: str | None,
         metrics: str | None, bench: str | None, html: str | None) -> None:
    from toolkit.diagnose.read.fastpath.ahead import range_workers
    from toolkit.runtime.host_memory import keep_freed_memory

    keep_freed_memory()  # this process is the command's own: a heap at its peak size is what it needs
    # NOTE: the workers start reading the first log (and stashing its hot lines for `--export`) while the analysis
    # is imported
    with (_stash(export) as stash,
          range_workers(read_ahead=logs[0] if logs else None, job=stash.job if stash is not None else None)):
        if stash is not None:
            stash.warm()
        _report(logs, fmt, plots, stash, fail_on, metrics, bench, html)


def _stash(export: str | None) -> AbstractContextManager:
    """`--export`'s stash of the read (`export.EventStash`), or nothing; a place it cannot write fails now."""
    if export is None:
        return nullcontext()
    from toolkit.diagnose.read.export import EventStash

    try:
        return EventStash(export)
    except (OSError, ValueError) as exc:
        _fail(f"--export {export}: {exc}")


def _report(logs: list[str], fmt: str, plots: str | None, stash: EventStash | None, fail_on: str | None,
            metrics: str | None, bench: str | None, html: str | None) -> None:
    from rich.console import Console

    from toolkit.diagnose.analysis import analyze

    try:
        result = analyze(logs, metrics=metrics, bench=bench, tap=stash)
    except (OSError, ValueError, EOFError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # a path is never broken over lines
    if plots:
        from toolkit.diagnose.plots import write_plots

        for path in write_plots(result.timeline, plots):
            err.print(f"plot: {path}", markup=False)
    if stash is not None:
        from toolkit.diagnose.read.export import write_events

        try:
            err.print(f"events: {write_events(stash, result)}", markup=False)
        except (OSError, ValueError) as exc:
            _fail(f"--export {stash.out}: {exc}")
    if html and _html_writer is not None:
        try:
            err.print(f"html: {_html_writer(result, html)}", markup=False)
        except (OSError, ValueError) as exc:
            _fail(str(exc))
    if fmt == "json":
        from toolkit.diagnose.report_json import render_json

        typer.echo(render_json(result))
    else:
        from toolkit.diagnose.report_terminal import render

        render(result, Console(highlight=False))
    if fail_on is not None and result.fails(fail_on):
        raise typer.Exit(1)


def _run_fleet(logs: list[str], fmt: str, plots: str | None, fail_on: str | None) -> None:
    from rich.console import Console

    from toolkit.diagnose.fleet import analyze_fleet

    try:
        fleet = analyze_fleet(logs)
    except (OSError, ValueError, EOFError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if plots:
        from toolkit.diagnose.plots import write_plots

        err = Console(stderr=True, highlight=False, soft_wrap=True)  # a path is never broken over lines
        for worker in fleet.workers:
            folder = os.path.join(plots, "".join(c if c.isalnum() or c in "_.-" else "_" for c in worker.name))
            for path in write_plots(worker.diagnosis.timeline, folder):
                err.print(f"plot: {path}", markup=False)
    if fmt == "json":
        from toolkit.diagnose.report_fleet import render_fleet_json

        typer.echo(render_fleet_json(fleet))
    else:
        from toolkit.diagnose.report_fleet import render_fleet

        render_fleet(fleet, Console(highlight=False))
    if fail_on is not None and fleet.fails(fail_on):
        raise typer.Exit(1)
