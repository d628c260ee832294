"""Which event a message is, from how it starts (`diagnose.log_format.messages`, docs/log-formats.md §2-§9).

`kind_of(line, start)` matches at the message start only; `error_kinds(text)` reads the kinds an exception's
own error lines name (a hard OOM or a leak raised as `RuntimeError: ...`), never a traceback's source lines.
"""
from __future__ import annotations

import re

from toolkit.diagnose.log_format.messages import STARTS

_MESSAGE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in STARTS.items()))
_ERROR_LINE = re.compile(r"^\s*[\w.]{0,80}(?:Error|Exception|Warning): (.*)$", re.M)
_ERROR_KINDS = frozenset({"oom", "leak", "not_enough_memory"})
# An error line on its own (no traceback open): `ValueError: ...`, in backticks, or a repr `Error('...`.
_ERROR_START = re.compile(r"`?[\w.]{0,80}(?:Error|Exception)(?:: |\(['\"])")


def kind_of(line: str, start: int = 0) -> str | None:
    """The event kind of the message starting at `start`, None when it is none of them."""
    m = _MESSAGE.match(line, start)
    return m.lastgroup if m is not None else None


def line_kind(line: str, start: int = 0) -> str | None:
    """The kind of a line that opens no record: `kind_of`, else the oom / leak / not_enough_memory kind of an
    error line (`ValueError: No available memory ...`) read on its own."""
    kind = kind_of(line, start)
    if kind is not None:
        return kind
    m = _ERROR_START.match(line, start)
    named = kind_of(line, m.end()) if m is not None else None
    return named if named in _ERROR_KINDS else None


def error_kinds(text: str) -> list[str]:
    """The kinds (oom, leak, not_enough_memory) named by the error lines of an exception's text."""
    found: list[str] = []
    for message in _ERROR_LINE.findall(text):
        kind = kind_of(message)
        if kind in _ERROR_KINDS and kind not in found:
            found.append(kind)
    return found
