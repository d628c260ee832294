"""toolkit: an LLM-serving runtime bundled with a load generator and a log doctor.

Subpackages: `toolkit.runtime` (serve), `toolkit.bench` (load generation), `toolkit.diagnose` (log doctor),
`toolkit.reports` (HTML), `toolkit.traces` (workload data); `toolkit.cli` composes the command line.
"""
from toolkit.version import __version__

__all__ = ["__version__"]
