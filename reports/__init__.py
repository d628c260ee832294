"""`toolkit report`: bench records and the server log of the same window -> one self-contained HTML page.

The public API is `build_report(...)` (write a report) and `render_report(...)` (the HTML as text); both are
imported lazily so that `toolkit --help` stays fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.reports.build import build_report, render_report

__all__ = ["build_report", "render_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from toolkit.reports import build

        return getattr(build, name)
    raise AttributeError(name)
