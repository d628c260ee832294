"""The version of the installed distribution (one place; the CLI, the server and reports read it)."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("toolkit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
