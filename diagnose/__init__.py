"""`toolkit diagnose`: SGLang-era server logs -> events -> timeline -> findings -> advice.

The public API is `analyze(...) -> Diagnosis`; it is imported lazily so that `toolkit --help` stays fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.diagnose.analysis import Diagnosis, analyze

__all__ = ["Diagnosis", "analyze"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from toolkit.diagnose import analysis

        return getattr(analysis, name)
    raise AttributeError(name)
