"""`toolkit diagnose`: the typer command. Heavy imports happen inside the command so `toolkit --help` is fast."""
from __future__ import annotations

import os
from typing import List, Optional

import typer

FORMATS = ("text", "json")
FAIL_ON = ("info", "warning", "critical")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _check_inputs(logs: list[str], fmt: str, fail_on: str | None, export: str | None, bench: str | None) -> None:
    if not logs:
        _fail("no log given: pass one or more server log files, .gz files, or - for stdin")
    if fmt not in FORMATS:
        _fail(f"unknown --format {fmt!r}: choose text or json")
    if fail_on is not None and fail_on not in FAIL_ON:
        _fail(f"unknown --fail-on {fail_on!r}: choose info, warning or critical")
    if export is not None and not export.endswith((".csv", ".parquet")):
        _fail(f"--export needs a .csv or .parquet file name, not {export!r}")
    for path in logs + ([bench] if bench else []):
        if path != "-" and not os.path.isfile(path):
            _fail(f"no such file: {path}")


def diagnose(
    logs: Optional[List[str]] = typer.Argument(None, help="Server logs: plain, .gz, or - for stdin."),
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
    """Turn SGLang-era server logs into evidence-backed tuning advice and plots."""
    logs = list(logs or [])
    _check_inputs(logs, fmt, fail_on, export, bench)
    from rich.console import Console

    from toolkit.diagnose.analysis import analyze

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

        err.print(f"events: {write_events(result.timeline, export)}", markup=False)
    if html:
        from toolkit.reports.build import render_report, write_html
        from toolkit.reports.inputs import ReportError

        try:
            err.print(f"html: {write_html(render_report([], result), html)}", markup=False)
        except ReportError as exc:
            _fail(str(exc))
    if fmt == "json":
        from toolkit.diagnose.report_json import render_json

        typer.echo(render_json(result))
    else:
        from toolkit.diagnose.report_terminal import render

        render(result, Console(highlight=False))
    if fail_on is not None and result.fails(fail_on):
        raise typer.Exit(1)
