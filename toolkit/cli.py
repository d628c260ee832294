"""The `toolkit` command: the composition root that wires each part's CLI into one typer app."""
from __future__ import annotations

from pathlib import Path

import typer

from toolkit.version import __version__

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
    from toolkit.runtime.server.serve import main as serve_main

    raise typer.Exit(serve_main(ctx.args))


@app.command("bench-offline", context_settings=_PASSTHROUGH, add_help_option=False)
def bench_offline(ctx: typer.Context) -> None:
    """Offline throughput of the in-process engine (like sglang.bench_offline_throughput)."""
    from toolkit.bench.offline import main as bench_offline_main

    raise typer.Exit(bench_offline_main(ctx.args))

# -- registrations --
from toolkit.bench.cli import bench  # noqa: E402
app.command("bench")(bench)
from toolkit.diagnose.cli import diagnose  # noqa: E402
app.command("diagnose")(diagnose)
from toolkit.reports.cli import report  # noqa: E402
app.command("report")(report)
from toolkit.tune.cli import tune  # noqa: E402
app.command("tune")(tune)


@app.command("demo")
def demo(
    out: Path = typer.Option(Path("toolkit-out/demo"), "--out", help="Folder for the logs, tune steps and pages."),
    num_prompts: int = typer.Option(42, "--num-prompts", min=1, help="Chat requests per run."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Runs per configuration."),
    max_steps: int = typer.Option(4, "--max-steps", min=0, help="Most configurations to try after the start."),
    max_time: float = typer.Option(420.0, "--max-time", help="Seconds of tuning; no step starts past it."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if present, else CPU), cpu or cuda."),
) -> None:
    """Tune the embedded model's server from a mistuned start and show the gain, step by step."""
    from rich.console import Console

    from toolkit.demo import DemoSettings, run_demo

    console = Console()
    try:
        run_demo(DemoSettings(out, num_prompts, repeats, max_steps, max_time, device), console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every server was stopped[/]")
        raise typer.Exit(130) from None
    except (RuntimeError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
