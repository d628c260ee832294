"""The `toolkit` command's root: help and version."""
from __future__ import annotations

from typer.testing import CliRunner

from toolkit.version import __version__
from toolkit.cli import app


def test_version_prints_the_package_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"toolkit {__version__}"


def test_help_lists_the_commands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Serve LLMs, load-test them" in result.output
