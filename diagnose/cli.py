"""`toolkit diagnose`: the typer command. Heavy imports happen inside the command so `toolkit --help` is fast.

`--html` writes the `toolkit report` page; the report lives downstream of the diagnosis, so this module never
imports it: the CLI composition root hands it the page writer with `use_html_writer`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, List, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from toolkit.diagnose.analysis import Diagnosis

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
    from toolkit.diagnose.source import LogError, check_log

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


def _spool_stdin(logs: list[str], directory: str) -> list[str]:
    """`-` read into a file once, so that `--export` can read the log a second time."""
    if "-" not in logs:
        return logs
    path = os.path.join(directory, "stdin.log")
    with open(path, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    return [path if p == "-" else p for p in logs]


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
) -> None:
    """Turn SGLang or vLLM server logs into evidence-backed tuning advice and plots."""
    logs = list(logs or [])
    _check_inputs(logs, fmt, fail_on, export, bench, html)
    with tempfile.TemporaryDirectory(prefix="toolkit-diagnose-") as spool:
        sources = _spool_stdin(logs, spool) if export else logs
        _run(sources, fmt, plots, export, fail_on, metrics, bench, html)


def _run(logs: list[str], fmt: str, plots: str | None, export: str | None, fail_on: str | None,
         metrics: str | None, bench: str | None, html: str | None) -> None:
    from rich.console import Console

    from toolkit.diagnose.analysis import analyze
    from toolkit.diagnose.fastpath.ahead import keep_freed_memory

    keep_freed_memory()  # this process is the command's own: a heap at its peak size is what it needs

    try:
        result = analyze(logs, metrics=metrics, bench=bench)
    except (OSError, ValueError, EOFError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    err = Console(stderr=True, highlight=False)
    if plots:
        from toolkit.diagnose.plots import write_plots

        for path in write_plots(result.timeline, plots):
            err.print(f"plot: {path}", markup=False)
    if export:
        from toolkit.diagnose.export import write_events

        try:
            err.print(f"events: {write_events(logs, export, result)}", markup=False)
        except (OSError, ValueError) as exc:
            _fail(f"--export {export}: {exc}")
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
