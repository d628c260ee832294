"""Which event a message is, from how it starts (`diagnose.log_format.messages`, docs/log-formats.md §2-§9).

`kind_of(line, start)` matches at the message start only; `error_kinds(text)` reads the kinds an exception's
own error lines name (a hard OOM, a leak or a failed CUDA-graph capture raised as `RuntimeError: ...`), never a
traceback's source lines.
At a start `kind_of` tries only the kinds whose pattern can begin with its first character (read from each
pattern once, by CPython's own regex parser; a pattern it cannot narrow is tried at every start): the same
answer as the whole alternation, in about half the time.
"""
from __future__ import annotations

import functools
import re
from re import _constants, _parser  # type: ignore[attr-defined]

from toolkit.diagnose.log_format.messages import KV_MEMORY_CHECK, STARTS, TRACEBACK_FRAME

_MESSAGE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in STARTS.items()))
_ERROR_LINE = re.compile(r"^\s*[\w.]{0,80}(?:Error|Exception|Warning): (.*)$", re.M)
# what an error line can name: the cause of the exception it ends (each has a rule of its own)
_ERROR_KINDS = frozenset({"oom", "leak", "not_enough_memory", "graph_failed"})
# An error line on its own (no traceback open): `ValueError: ...`, in backticks, or a repr `Error('...`.
ERROR_START = r"`?[\w.]{0,80}(?:Error|Exception)(?:: |\(['\"])"
_ERROR_START = re.compile(ERROR_START)
# NOTE: a lookahead that fails at a message `line_kind` may read as an event: one `kind_of` reads, or any error
# line (`line_kind` reads only some as events: it errs toward "maybe an event"), or a traceback's frame (the first
# line of a log that begins inside a traceback opens one)
NO_EVENT = ("(?!" + "|".join(f"(?:{pattern})" for pattern in STARTS.values()) + ")(?!" + ERROR_START + ")(?!"
            + TRACEBACK_FRAME + ")")


def kind_of(line: str, start: int = 0) -> str | None:
    """The event kind of the message starting at `start`, None when it is none of them."""
    head = line[start: start + 1]
    pattern = _BY_FIRST.get(head, _MESSAGE)
    if pattern is _UNSEEN:
        pattern = _BY_FIRST[head] = _starting_with(head)
    if pattern is None:
        return None
    m = pattern.match(line, start)
    return m.lastgroup if m is not None else None


# -- the alternation tried at a message start: only the starts that can begin with its first character --------

_UNSEEN = re.compile("")
_BY_FIRST: dict[str, re.Pattern[str] | None] = dict.fromkeys(map(chr, range(128)), _UNSEEN)  # other: _MESSAGE


def _starting_with(char: str) -> re.Pattern[str] | None:
    """`_MESSAGE` without the starts that cannot begin with `char` (in the same order, so the same match)."""
    kinds = tuple(kind for kind, first in _first_characters().items() if first is None or char in first)
    return _alternation(kinds)


@functools.lru_cache(maxsize=None)
def _alternation(kinds: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?P<{kind}>{STARTS[kind]})" for kind in kinds)) if kinds else None


@functools.lru_cache(maxsize=1)
def _first_characters() -> dict[str, frozenset[str] | None]:
    """{kind: the characters its start can begin with}, None where that is not read exactly here (a class of
    characters, a category such as `\\w`, a start that may be empty): such a start is tried at every message."""
    out: dict[str, frozenset[str] | None] = {}
    for kind, pattern in STARTS.items():
        try:
            parsed = _parser.parse(pattern)
            first, may_be_empty = _first_of_sequence(parsed)
            if parsed.state.flags & re.IGNORECASE:
                first = None
        except (AttributeError, TypeError, ValueError, re.error):  # NOTE: `re._parser` is CPython's own
            first, may_be_empty = None, True
        out[kind] = None if first is None or may_be_empty else frozenset(first)
    return out


def _first_of_sequence(items) -> tuple[set[str] | None, bool]:
    """(first characters, whether the sequence may match empty) of a parsed pattern; None: any character."""
    first: set[str] = set()
    for op, arg in items:
        chars, may_be_empty = _first_of_item(op, arg)
        if chars is None:
            return None, False
        first |= chars
        if not may_be_empty:
            return first, False
    return first, True


def _first_of_item(op, arg) -> tuple[set[str] | None, bool]:
    if op is _constants.LITERAL:
        return {chr(arg)}, False
    if op is _constants.IN and all(o in (_constants.LITERAL, _constants.RANGE) for o, _ in arg):
        ranges = [(a, a) if o is _constants.LITERAL else a for o, a in arg]
        return {chr(c) for low, high in ranges for c in range(low, high + 1)}, False
    if op is _constants.BRANCH:
        first: set[str] = set()
        empty = False
        for branch in arg[1]:
            chars, may_be_empty = _first_of_sequence(branch)
            if chars is None:
                return None, False
            first |= chars
            empty = empty or may_be_empty
        return first, empty
    if op is _constants.SUBPATTERN and not arg[1] and not arg[2]:  # a group without flags of its own
        return _first_of_sequence(arg[3])
    if op in (_constants.MAX_REPEAT, _constants.MIN_REPEAT):
        chars, may_be_empty = _first_of_sequence(arg[2])
        return chars, may_be_empty or arg[0] == 0
    return None, False


def line_kind(line: str, start: int = 0) -> str | None:
    """The kind of a line that opens no record: `kind_of`, else the error kind (`_ERROR_KINDS`) of an error line
    (`ValueError: No available memory ...`) read on its own."""
    kind = kind_of(line, start)
    if kind is not None:
        return kind
    m = _ERROR_START.match(line, start)
    named = kind_of(line, m.end()) if m is not None else None
    return named if named in _ERROR_KINDS else None


def error_lines(text: str) -> list[str]:
    """The messages of an exception's error lines (`RuntimeError: ...` -> `...`), in order: a chained exception
    (`During handling of the above exception ...`) prints more than one."""
    return _ERROR_LINE.findall(text)


def error_line(text: str) -> str | None:
    """The message of the last error line of an exception's text, None when the text holds none (a traceback cut
    before it)."""
    found = error_lines(text)
    return found[-1] if found else None


_MEMORY_WORDS = re.compile(r"memory|\bOOM\b", re.I)


def cut_or_about_memory(text: str) -> bool:
    """Whether an exception's error line is cut (a traceback's tail not pasted) or names memory: a start-up crash
    a memory rule may explain."""
    said = error_line(text)
    return said is None or _MEMORY_WORDS.search(said) is not None


def error_kinds(text: str) -> list[str]:
    """The error kinds (`_ERROR_KINDS`) named by the error lines of an exception's text; a text cut before any
    inside vLLM's KV cache memory check is `not_enough_memory` (`cut_in_kv_check`)."""
    found: list[str] = []
    for message in _ERROR_LINE.findall(text):
        kind = kind_of(message)
        if kind in _ERROR_KINDS and kind not in found:
            found.append(kind)
    if not found and cut_in_kv_check(text):
        found.append("not_enough_memory")
    return found


_KV_MEMORY_CHECK = re.compile(KV_MEMORY_CHECK)


def cut_in_kv_check(text: str) -> bool:
    """Whether an exception's text holds no error line and ends in vLLM's KV cache memory check (its last frame,
    or the call into it on its last line)."""
    return error_line(text) is None and _KV_MEMORY_CHECK.search("\n".join(text.rsplit("\n", 2)[-2:])) is not None
