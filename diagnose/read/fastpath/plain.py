"""Plain lines told from their bytes: the range workers' quick answer to `lines.is_plain` for the commonest plain
lines (a printable ASCII line behind an SGLang stamp or a vLLM prefix whose message is no event), without decoding
them. Both readers answer True only where `is_plain` of the decoded line does (tests/diagnose/
test_log_format_differential.py checks them on every sample, real and benchmark line and on lines changed at random);
False means "ask `is_plain`".

- `surely_plain(raw)`: one line's bytes, its prefix read by the per-line grammar;
- `stamped_plain(...)`: a chunk's slow lines whose stamp the scanner has read (`scan.StampedLines`), the same
  answer as `surely_plain` with the stamp's part done in word operations: only the message start is matched;
- `vllm_plain(...)`: a chunk's other slow lines behind a vLLM prefix, read by layouts (`outer.prefix_layouts`):
  True only where `surely_plain` is, for the commonest of them (a message without `[` or `:`).
"""
from __future__ import annotations

import functools
import re
from itertools import repeat

import numpy as np

from toolkit.diagnose.read.fastpath.outer import Form, prefix_layouts
from toolkit.diagnose.read.fastpath.scan import StampedLines
from toolkit.diagnose.read.fastpath.words import Words, occurrences
from toolkit.diagnose.read.messages import ERROR_START, NO_EVENT, STARTS, TRACEBACK_FRAME, TRACEBACK_HEAD
from toolkit.diagnose.read.prefix import (FIRST_STAMP, FIRST_STAMP_DATE, NOTHING_MORE, PREFIXES_AFTER_STAMP,
                                                VLLM_DEFAULT_YEAR, VLLM_MONTH_DAY, VLLM_PREFIX,
                                                VLLM_PREFIX_FIRST_BYTES, is_date)
from toolkit.diagnose.read.source import PASTED_RESET

# NOTE: `is_plain` of a printable ASCII line (tabs too), matched on its bytes: on ASCII text a bytes pattern and a
# str pattern match alike (`\s`, `\w`, `\d`, case folding), and decoding it removes nothing (no CR, no escape
# code). Each pattern is the prefix `is_plain` reads first, in an atomic group (the match it takes), then no event.
_PLAIN_SGLANG = re.compile((FIRST_STAMP + NOTHING_MORE + NO_EVENT).encode("ascii"))
# a vLLM prefix at the line's start, no SGLang stamp on the line (`read_prefix` would read that first) and no record
# glued after it (`glued_records`)
_PLAIN_VLLM = re.compile(("(?!" + FIRST_STAMP + ")(?>" + VLLM_PREFIX + ")" + NO_EVENT + r"(?!.*?\s" + VLLM_PREFIX
                          + ")").encode("ascii"))
_VLLM_DATE = tuple(re.compile(FIRST_STAMP).groups + g for g in VLLM_MONTH_DAY)
_NOT_PRINTABLE = bytes(sorted(set(range(256)) - {ord("\t")} - set(range(0x20, 0x7F))))
_PASTED_RESET = PASTED_RESET.encode()  # decoding removes the colour codes of a line that holds it
_TRACEBACK = TRACEBACK_HEAD.encode()  # a line that holds one anywhere is no plain line (`lines.is_plain`)
_NOT_PRINTABLE_NOR_NEWLINE = _NOT_PRINTABLE.replace(b"\n", b"")
_UNPRINTABLE = np.zeros(256, bool)  # by byte value: `_NOT_PRINTABLE_NOR_NEWLINE`
_UNPRINTABLE[list(_NOT_PRINTABLE_NOR_NEWLINE)] = True


def surely_plain(raw: bytes | bytearray) -> bool:
    """True only for a line (its bytes, no newline) that `is_plain` reads as plain once decoded: a printable ASCII
    line behind an SGLang stamp or a vLLM prefix, the commonest plain lines, told without decoding; False: ask
    `is_plain`."""
    if len(raw.translate(None, _NOT_PRINTABLE)) != len(raw) or _PASTED_RESET in raw or _TRACEBACK in raw:
        return False
    m = _PLAIN_SGLANG.match(raw)
    if m is not None:
        return _is_calendar_date(*m.group(*FIRST_STAMP_DATE))
    m = _PLAIN_VLLM.match(raw)
    return m is not None and _is_calendar_date(VLLM_DEFAULT_YEAR, *m.group(*_VLLM_DATE))


@functools.lru_cache(maxsize=256)
def _is_calendar_date(year: bytes | int | None, month: bytes | None, day: bytes | None) -> bool:
    """A stamp without a date is a time of day (`stamped_message_start` takes it)."""
    return month is None or bool(is_date(int(year or 0), int(month), int(day or 0)))


def stamped_plain(data: bytearray, starts: np.ndarray, ends: np.ndarray, stamped: StampedLines) -> np.ndarray:
    """Per line of `stamped` (the chunk's lines are `data[starts[i]:ends[i]]`): `surely_plain` of its bytes. A
    line behind a whole dated SGLang stamp, before any other `[` (the scanner's outer prefixes hold none that opens
    a stamp, and no quote), is `FIRST_STAMP` up to its message; it is plain where it is printable ASCII and no
    piece of `_NOT_PLAIN_AT` matches at its message's start."""
    plain = stamped.dated.copy()
    rows = np.flatnonzero(plain)
    begin, end = starts[stamped.index[rows]], ends[stamped.index[rows]]
    view = memoryview(data)
    joined = b"\n".join([view[a:b] for a, b in zip(begin.tolist(), end.tolist())])
    if len(joined.translate(None, _NOT_PRINTABLE_NOR_NEWLINE)) != len(joined):
        plain[rows[_holding(joined, end - begin, _UNPRINTABLE)]] = False
    if _TRACEBACK in joined:
        plain[rows[_finding(joined, end - begin, _TRACEBACK)]] = False
    rows = np.flatnonzero(plain)
    found = map(_NOT_PLAIN_AT.match, repeat(data), stamped.message[rows].tolist(), ends[stamped.index[rows]].tolist())
    plain[rows] = np.fromiter((m is None for m in found), bool, len(rows))
    return plain


def _finding(joined: bytes, lengths: np.ndarray, piece: bytes) -> np.ndarray:
    """Which of the lines joined (by newlines, `lengths` bytes each) hold `piece` (a rare one)."""
    begins = np.concatenate(([0], np.cumsum(lengths[:-1] + 1)))
    holds = np.zeros(len(lengths), bool)
    holds[np.searchsorted(begins, occurrences(joined, piece), side="right") - 1] = True
    return holds


def _holding(joined: bytes, lengths: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which of the lines joined (by newlines, `lengths` bytes each) hold a byte that `table` marks (by value)."""
    bad = np.flatnonzero(table[np.frombuffer(joined, np.uint8)])
    begins = np.concatenate(([0], np.cumsum(lengths[:-1] + 1)))
    found = np.zeros(len(lengths), bool)
    found[np.searchsorted(begins, bad, side="right") - 1] = True
    return found


# NOTE: what, at a message's start, makes its line other than plain: a prefix that may follow the stamp
# (`NOTHING_MORE` fails there) or an event's or an error's start (`NO_EVENT` fails); each lookahead fails where one
# of its pieces matches. One pattern: narrowing it by the message's first byte (as `kind_of` does) saves less per
# line than a worker spends compiling each narrowed pattern.
_NOT_PLAIN_PIECES = (*PREFIXES_AFTER_STAMP, *STARTS.values(), ERROR_START, TRACEBACK_FRAME)
_NOT_PLAIN_AT = re.compile("|".join(f"(?:{piece})" for piece in _NOT_PLAIN_PIECES).encode("ascii"))


# NOTE: a vLLM prefix read by layouts: the grammar alone, its groups where `VLLM_PREFIX` has them
_VLLM_PREFIX = Form(re.compile(VLLM_PREFIX.encode("ascii")), b"", VLLM_PREFIX_FIRST_BYTES)
_NOT_IN_MESSAGE = _UNPRINTABLE.copy()  # by byte value: what `vllm_plain` leaves to `surely_plain` in a message
_NOT_IN_MESSAGE[[ord("["), ord(":")]] = True


def vllm_plain(data: bytearray, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per line of `rows` (the chunk's lines are `data[starts[i]:ends[i]]`): True only where `surely_plain` of its
    bytes is. A line behind a vLLM prefix of a layout whose fixed bytes are printable, hold no pasted reset and
    no `[` before a digit (the layout's other bytes are digits: no SGLang stamp can start in the prefix), with a
    calendar date, and whose message is printable and holds no `[` (no SGLang stamp after the prefix) and no `:`
    (no vLLM record glued on: its clock has one): plain where no piece of `_NOT_PLAIN_AT` matches at its
    message's start. False: ask `surely_plain`."""
    plain = np.zeros(len(rows), bool)
    begin = starts[rows]
    skip, which, found = prefix_layouts(Words(data), begin, _VLLM_PREFIX)
    usable = np.array([_usable(m.group()) for m in found] + [False])  # which == -1 reads the last
    rows_in = np.flatnonzero(usable[which])
    if len(rows_in) == 0:
        return plain
    which, begin = which[rows_in], begin[rows_in]
    month, day = (np.array([m.start(group) for m in found])[which] + begin for group in VLLM_MONTH_DAY)
    dated = is_date(VLLM_DEFAULT_YEAR, _number(data, month), _number(data, day))
    rows_in = rows_in[dated]
    message, end = begin[dated] + skip[rows_in], ends[rows[rows_in]]
    view = memoryview(data)
    joined = b"\n".join([view[a:b] for a, b in zip(message.tolist(), end.tolist())])
    clean = ~_holding(joined, end - message, _NOT_IN_MESSAGE)
    rows_in, message, end = rows_in[clean], message[clean], end[clean]
    found_at = map(_NOT_PLAIN_AT.match, repeat(data), message.tolist(), end.tolist())
    plain[rows_in] = np.fromiter((m is None for m in found_at), bool, len(rows_in))
    return plain


def _number(data: bytearray, at: np.ndarray) -> np.ndarray:
    """The two-digit numbers at offsets `at` (digits: the layout says so)."""
    pairs = np.frombuffer(data, np.uint8)[np.stack([at, at + 1])].astype(np.int64) - ord("0")
    return pairs[0] * 10 + pairs[1]


def _usable(prefix: bytes) -> bool:
    """Whether a layout's fixed bytes (its digits stand for any digit) can only begin a line `surely_plain` reads
    behind a vLLM prefix."""
    printable = len(prefix.translate(None, _NOT_PRINTABLE)) == len(prefix)
    # NOTE: the grammar's optional space after `]`: a layout learned from a line without it would start another
    # line's message at that space, where `surely_plain` (the regex) starts it after
    complete = prefix.endswith(b" ")
    return printable and complete and _PASTED_RESET not in prefix and re.search(rb"\[\d", prefix) is None
