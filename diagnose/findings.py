"""Findings: what a rule concluded, with the evidence behind it and the flag that would change it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
MAX_LINES = 20


def rank_of(severity: str) -> int:
    return SEVERITIES.index(severity)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Counts and where to look: `count` of `total` lines matched (`fraction`), over `span` (log clock
    seconds), first `lines` (source line numbers), and `facts` (named numbers the message quotes)."""

    count: int = 0
    total: int | None = None
    span: tuple[float, float] | None = None
    lines: tuple[int, ...] = ()
    facts: Mapping[str, float | int | str | None] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        return self.count / self.total if self.total else None


@dataclass(frozen=True, slots=True)
class Finding:
    """One conclusion. `flag` and `suggested` say what to change (None when nothing on the server would
    help), `current` what it is now, `tradeoff` what the change costs."""

    id: str
    severity: Severity
    title: str
    message: str
    evidence: Evidence
    flag: str | None = None
    suggested: str | None = None
    current: str | None = None
    tradeoff: str | None = None
    ranks: tuple[str, ...] = ()


def evidence(rows: pd.DataFrame, total: int | None = None, **facts: float | int | str | None) -> Evidence:
    """Evidence from the matching rows of a timeline frame."""
    times = rows["time"].dropna() if "time" in rows else pd.Series(dtype=float)
    span = (float(times.min()), float(times.max())) if len(times) else None
    lines = tuple(int(x) for x in rows["line"].head(MAX_LINES)) if "line" in rows else ()
    return Evidence(len(rows), total, span, lines, dict(facts))


def evidence_rows(rows: Sequence[tuple], **facts: float | int | str | None) -> Evidence:
    """Evidence from raw event rows `(kind, line, time, rank, text, source)`."""
    times = [r[2] for r in rows if r[2] is not None]
    span = (min(times), max(times)) if times else None
    return Evidence(len(rows), None, span, tuple(r[1] for r in rows[:MAX_LINES]), dict(facts))
