"""`toolkit serve`: SGLang's argparse flags, passed through verbatim (the server parses them itself)."""
from __future__ import annotations

import typer


def serve(ctx: typer.Context) -> None:
    """Launch the SGLang-compatible HTTP server (same flags as sglang.launch_server)."""
    from toolkit.runtime.server.serve import main as serve_main

    raise typer.Exit(serve_main(ctx.args))
