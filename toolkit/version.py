"""The version of the installed distribution (one place; the CLI, the server and reports read it).

Read on first use (PEP 562): `importlib.metadata` costs about 60 ms to import, which every command would pay
at start-up, `toolkit diagnose` included, while only `--version`, the server and reports print it.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolkit")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
