"""`toolkit report`: the typer command. Heavy imports happen inside the command so `toolkit --help` is fast."""
from __future__ import annotations

import os
from typing import List, NoReturn, Optional

import typer


def diagnosis_html(diagnosis, out: str):
    """`toolkit diagnose --html FILE`: the report page of a diagnosis without bench records (the composition root
    hands this to diagnose, which never imports reports: data flows log -> diagnosis -> report)."""
    from toolkit.reports.build import render_report, write_html

    return write_html(render_report([], diagnosis), out)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def report(
    bench: Optional[List[str]] = typer.Option(None, "--bench", help="A `toolkit bench` RUN.jsonl (a run or a "
                                              "sweep); repeat for several files."),
    server_log: Optional[str] = typer.Option(None, "--server-log", help="The server's log of the same window."),
    out: str = typer.Option("report.html", "--out", "-o", help="Where to write the HTML page."),
    title: Optional[str] = typer.Option(None, "--title", help="Page title (default: model, dataset and runs)."),
    open_: bool = typer.Option(False, "--open", help="Show the page: a browser if there is one, else serve it "
                                                     "on 127.0.0.1 until Ctrl-C."),
) -> None:
    """One self-contained HTML page from bench runs and the server log: tables, curves, timeline, diagnosis."""
    bench = list(bench or [])
    if not bench and server_log is None:
        _fail("nothing to report: give --bench RUN.jsonl and/or --server-log FILE")
    for flag, given in [("--bench", b) for b in bench] + [("--server-log", server_log)]:
        if given is not None and not os.path.isfile(given):
            _fail(f"{flag} {given}: no such file")
    from pathlib import Path

    from toolkit.reports.build import build_report
    from toolkit.reports.inputs import ReportError, read_all

    try:
        path = build_report(read_all(bench), server_log, out, title, bench_sources=bench)
    except ReportError as exc:
        _fail(str(exc))
    typer.echo(f"report: {path}")
    if open_:
        from toolkit.reports.viewer import show

        show(Path(path), typer.echo)
