"""Events: one recognised log message (docs/log-formats.md §1-§8), the only event type of `toolkit diagnose`; the
kinds are named in `diagnose.read.messages`.

Fields are read lazily from `text` (`diagnose.read.fields`): the parsers only classify. Batch and stats lines (the
time series) become columns in `diagnose.read.series`; every other event stays an `Event`.
"""
from __future__ import annotations

from typing import NamedTuple

from toolkit.diagnose.read.fields import Value, parse_fields
from toolkit.diagnose.read.rank import Rank


class Event(NamedTuple):
    """One recognised message. `line` is 1-based in its source; `time` is seconds on the log's clock (naive
    timestamps read as UTC; `None` when the era prints none); `rank` is the rank that wrote it (its name `""` when
    none, else e.g. `"DP1 TP0"` or `"GPU0"`); `text` is the message from its start (after the time, rank and
    process prefix), with a multi-line record's continuation lines joined by newlines."""

    kind: str
    line: int
    time: float | None
    rank: Rank
    text: str
    source: int = 0

    @property
    def fields(self) -> dict[str, Value]:
        return parse_fields(self.kind, self.text)
