"""The serving runtime. `from toolkit.runtime import Engine` gives the offline API (imported lazily: torch is heavy)."""
from __future__ import annotations

import os
import sys
from typing import Any

if "torch" not in sys.modules:
    # NOTE: read once when torch loads its OpenMP runtime. Spinning waiters starve the process that holds the
    # other core (the HTTP front end, a bench client) and stall every parallel op; see runtime/cpu_threads.py.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from toolkit.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
