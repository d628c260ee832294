"""The `toolkit` command: the composition root that wires each part's CLI into one typer app."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

import typer

from toolkit.bench.cli import bench, bench_offline
from toolkit.demo import demo
from toolkit.diagnose.cli import diagnose, use_html_writer
from toolkit.reports.cli import diagnosis_html, report
from toolkit.runtime.cli import serve
from toolkit.tune.cli import tune

app = typer.Typer(
    name="toolkit",
    help="Serve LLMs, load-test them, and turn their logs into tuning advice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from toolkit.version import __version__

        typer.echo(f"toolkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Serve LLMs, load-test them, and turn their logs into tuning advice."""


# Every command is a function of its part's `cli` module (heavy imports happen inside it, so `--help` is fast),
# registered here and only here. Runtime commands take SGLang's argparse flags verbatim: typer passes them through.
_PASSTHROUGH = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
                "add_help_option": False}
_COMMANDS: tuple[tuple[str, Callable[..., None], dict], ...] = (
    ("serve", serve, _PASSTHROUGH),
    ("bench", bench, {}),
    ("bench-offline", bench_offline, _PASSTHROUGH),
    ("diagnose", diagnose, {}),
    ("report", report, {}),
    ("tune", tune, {}),
    ("demo", demo, {}),
)
for _name, _command, _settings in _COMMANDS:
    app.command(_name, **_settings)(_command)

# NOTE: `toolkit diagnose --html` writes the report's page; diagnose never imports reports, so it is wired here.
use_html_writer(diagnosis_html)


# NOTE: commands that leave nothing to tear down when they return (every file they write closed, no thread or
# child process left) end the process at once, without the interpreter's teardown: ~40 ms of freeing a few hundred
# modules and the tables, 4% of `toolkit diagnose` on a 1M-line log.
_ENDS_WITHOUT_TEARDOWN = frozenset({"diagnose"})


def main() -> None:
    try:
        app()
    except SystemExit as done:
        if sys.argv[1:2] and sys.argv[1] in _ENDS_WITHOUT_TEARDOWN:
            _exit_now(done.code)
        raise


def _exit_now(code: object) -> NoReturn:
    """`sys.exit(code)`'s status (a message printed), with the output flushed, and no teardown."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # NOTE: a reader that went away (`| head`): what the interpreter's own exit would ignore too
    os._exit(code or 0)


if __name__ == "__main__":
    main()
