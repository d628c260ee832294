"""toolkit: an LLM-serving runtime bundled with a load generator and a log doctor.

Subpackages: `toolkit.runtime` (serve), `toolkit.bench` (load generation), `toolkit.diagnose` (log doctor),
`toolkit.reports` (HTML), `toolkit.traces` (workload data); `toolkit.cli` composes the command line.
"""
from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name == "__version__":  # read on first use (toolkit.version)
        from toolkit import version

        return version.__version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
