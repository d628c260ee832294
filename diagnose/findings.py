"""Findings: what a rule concluded, with the evidence behind it, the typed change that would help and the knob's value
now; the advice text (`flag`, `suggested`, the current value's words) is rendered from them, never parsed back."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.vocabulary import Change, Engine, knob

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
Confidence = Literal["low", "medium", "high"]
Serves = Literal["throughput", "latency"]  # what a finding's change improves
MAX_LINES = 20
FEW_LINES = 3  # a finding on this many load lines or fewer has low confidence


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

    @property
    def seconds(self) -> float | None:
        """Log-clock seconds from the first to the last matching line, None without times."""
        return self.span[1] - self.span[0] if self.span else None


class Current(str):
    """A knob's value now: the words a finding says it in (the string itself: `0.9 (default)`, `1 (tp_size=2)`,
    `overlap on`) and the value they stand for (`value`: a number, a word, a switch's state; None where the log names
    none), which is what `toolkit tune` reads: the words are never parsed back."""

    value: int | float | str | bool | None

    def __new__(cls, said: str, value: int | float | str | bool | None) -> Current:
        current = super().__new__(cls, said)
        current.value = value
        return current

    @classmethod
    def of(cls, value: int | float | str | bool, note: str | None = None) -> Current:
        """The value said as the logs print it (a fraction by `:g`), with a note in parentheses."""
        said = f"{value:g}" if isinstance(value, float) else str(value)
        return cls(f"{said} ({note})" if note else said, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One conclusion. `change` is what to change on the server (None when nothing there would help), offered
    with `alternatives` (never applied) and `action` (what to do off the server, or the condition the
    alternatives hold under); `current` is what it is now, `tradeoff` what the change costs. `engine` names the
    flags the advice is written in. `rule` is the rule that found it (the part of `id` before the dot).
    `confidence` says how far the evidence carries: `high` for an error the engine printed or a rule's threshold
    met on enough load lines, `medium` / `low` for a problem a short excerpt already shows (`confidence_of`).
    `serves` says what its change improves: `latency` for a change that trades throughput for smoother or earlier
    tokens (a smaller chunk against decode stalls), which `toolkit tune` does not take for a throughput objective."""

    id: str
    severity: Severity
    title: str
    message: str
    evidence: Evidence
    change: Change | None = None
    current: Current | None = None
    tradeoff: str | None = None
    ranks: tuple[str, ...] = ()
    alternatives: tuple[Change, ...] = ()
    action: str | None = None
    engine: Engine = "sglang"
    confidence: Confidence = "high"
    serves: Serves = "throughput"

    @property
    def rule(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def flag(self) -> str | None:
        """The flag of the change, in the engine's words."""
        found = knob(self.change.idea, self.engine) if self.change else None
        return found.flag if found is not None else None

    @property
    def suggested(self) -> str | None:
        """The advice as text: the value with its companions and alternatives, or the action."""
        change, engine = self.change, self.engine
        if change is None:
            options = ", or ".join(a.as_flag(engine) for a in self.alternatives)
            return f"{self.action}: {options}" if self.action and options else self.action or options or None
        words = change.value_text()
        extras = [f"with {', '.join(c.as_flag(engine) for c in change.companions)}"] if change.companions else []
        extras += [f"or {a.as_flag(engine)}" for a in self.alternatives]
        if words is None:
            return None
        return f"{words} ({'; '.join(extras)})" if extras else words

    def advice(self) -> tuple[Literal["change", "do"], str] | None:
        """("change", "--flag value ...") or ("do", what to do), or None when the finding asks for nothing."""
        if self.flag:
            return "change", f"{self.flag} {self.suggested or ''}".strip()
        return ("do", self.suggested) if self.suggested else None


def confidence_of(lines: int, enough: int) -> Confidence:
    """`low` for up to FEW_LINES load lines, `medium` below `enough` (what the rule needs to judge), else `high`."""
    return "low" if lines <= FEW_LINES else "medium" if lines < enough else "high"


def evidence(rows: Rows, total: int | None = None, **facts: float | int | str | None) -> Evidence:
    """Evidence from the matching batch lines."""
    times = rows["time"]
    first, last = (float(np.fmin.reduce(times)), float(np.fmax.reduce(times))) if len(times) else (np.nan, np.nan)
    span = (first, last) if first == first else None  # fmin and fmax skip NaN: NaN only when all are
    lines = tuple(int(x) for x in rows.head(MAX_LINES)["line"].tolist())
    return Evidence(count=len(rows), total=total, span=span, lines=lines, facts=dict(facts))


def evidence_events(events: Sequence[Event], **facts: float | int | str | None) -> Evidence:
    """Evidence from events."""
    times = [e.time for e in events if e.time is not None]
    span = (min(times), max(times)) if times else None
    return Evidence(count=len(events), span=span, lines=tuple(e.line for e in events[:MAX_LINES]), facts=dict(facts))
