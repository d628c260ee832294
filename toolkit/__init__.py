"""toolkit: an LLM-serving runtime bundled with a load generator and a log doctor."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("toolkit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
