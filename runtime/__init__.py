"""The serving runtime. `from toolkit.runtime import Engine` gives the offline API (imported lazily: torch is heavy)."""
from __future__ import annotations

from typing import Any

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from toolkit.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
