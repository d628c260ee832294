"""The `toolkit` command: the composition root that wires each part's CLI into one typer app."""
from __future__ import annotations

import typer

from toolkit import __version__

app = typer.Typer(
    name="toolkit",
    help="Serve LLMs, load-test them, and turn their logs into tuning advice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"toolkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Serve LLMs, load-test them, and turn their logs into tuning advice."""


# Subcommands are registered below; each part owns its own `cli` module and keeps heavy imports lazy.
# Runtime commands take SGLang's argparse flags verbatim, so typer passes their arguments through.
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Launch the SGLang-compatible HTTP server (same flags as sglang.launch_server)."""
    from runtime.server.serve import main as serve_main

    raise typer.Exit(serve_main(ctx.args))


@app.command("bench-offline", context_settings=_PASSTHROUGH, add_help_option=False)
def bench_offline(ctx: typer.Context) -> None:
    """Offline throughput of the in-process engine (like sglang.bench_offline_throughput)."""
    from runtime.bench_offline import main as bench_offline_main

    raise typer.Exit(bench_offline_main(ctx.args))

# -- registrations --
from bench.cli import bench  # noqa: E402
app.command("bench")(bench)
from diagnose.cli import diagnose  # noqa: E402
app.command("diagnose")(diagnose)
from reports.cli import report  # noqa: E402
app.command("report")(report)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
