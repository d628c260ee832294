"""Findings: what a rule concluded, with the evidence behind it and the flag that would change it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from toolkit.diagnose.events import Event
from toolkit.diagnose.series import Rows

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
    help), `current` what it is now, `tradeoff` what the change costs. `rule` is the rule that found it
    (the part of `id` before the dot)."""

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

    @property
    def rule(self) -> str:
        return self.id.split(".", 1)[0]


def evidence(rows: Rows, total: int | None = None, **facts: float | int | str | None) -> Evidence:
    """Evidence from the matching batch lines."""
    times = rows["time"]
    first, last = (float(np.fmin.reduce(times)), float(np.fmax.reduce(times))) if len(times) else (np.nan, np.nan)
    span = (first, last) if first == first else None  # fmin and fmax skip NaN: NaN only when all are
    lines = tuple(int(x) for x in rows.head(MAX_LINES)["line"].tolist())
    return Evidence(len(rows), total, span, lines, dict(facts))


def evidence_events(events: Sequence[Event], **facts: float | int | str | None) -> Evidence:
    """Evidence from events."""
    times = [e.time for e in events if e.time is not None]
    span = (min(times), max(times)) if times else None
    return Evidence(len(events), None, span, tuple(e.line for e in events[:MAX_LINES]), dict(facts))
