"""Events: one recognised log message (docs/log-formats.md §1-§8), the only event type of `toolkit diagnose`; the
kinds are named in `diagnose.read.messages`.

Fields are read lazily from `text` (`diagnose.read.fields`, each kind's declared fields): the parsers only classify.
What an error record's text says is read into `error` (`diagnose.read.errors`). Batch and stats lines (the time
series) become columns in `diagnose.read.series`; every other event stays an `Event`. Judges read these, never the
text.
"""
from __future__ import annotations

from typing import NamedTuple

from toolkit.diagnose.read.errors import ErrorText, read_error
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.messages import start_in
from toolkit.diagnose.read.rank import Rank
from toolkit.diagnose.read.values import Value


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

    @property
    def error(self) -> ErrorText:
        """What its text says as an error record: error lines, signs, the engine it names, refusal sizes."""
        return read_error(self.text)

    @property
    def last_line(self) -> int:
        """The line its record ends at (a multi-line record's last)."""
        return self.line + self.text.count("\n")

    def glued(self, kind: str) -> dict[str, Value] | None:
        """The fields of a `kind` message glued on in its text (a paste that lost a newline: SGLang's pool line right
        after a capture's end, sglang#33483), None where none is."""
        at = start_in(kind, self.text)
        return parse_fields(kind, self.text[at:]) if at is not None else None
