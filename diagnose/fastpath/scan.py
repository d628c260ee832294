"""Which lines of a chunk are hot, and their kind, time and rank, in vectorized operations.

A hot line starts `[YYYY-mm-dd HH:MM:SS(.fff)( TAGn)*] ` (SGLang's logger since 0.3.6, docs/log-formats.md §1)
and its message is a decode or prefill line whose pieces the field reader reads completely, or an HTTP access
line (counted only: the analysis keeps no access events). Every other line (any other prefix, era, kind,
garbled, non-ASCII or with CR or escape codes) is `slow`: the per-line parser reads it, in order.

Each line's first bytes are read as 64-bit words; a rank tag is parsed once per distinct tag text (a chunk holds
a handful); labels are compared eight bytes at a time.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np

from toolkit.diagnose.fastpath.fields import read_pieces
from toolkit.diagnose.fastpath.words import (Words, all_digits, digit_at, first_below, first_byte, is_literal,
                                             parse_digits, two_digits, window, word_at)

DECODE, PREFILL, ACCESS = 0, 1, 2
HEAD = 72      # bytes of each line read for its stamp, rank tag and label
BATCH_KINDS = ("decode", "prefill")
MAX_TAG = 24   # longest rank tag text read here (" DP1 PP0 TP3 EP3" is 16); longer ones take the per-line path
MAX_CLIENT = 31
FEW = 8        # distinct tag texts matched one by one before sorting
_RANK = re.compile(r"(?:\s+[A-Z][A-Z_]*\d+)*\s*")
_STAMP = b"[0000-00-00 00:00:00"
_DECODE = (b"] Decode", b" batch")
_PREFILL = (b"] Prefil", b"l batch")
_ACCESS = (b"] INFO: ", b"    ")
_BODY = {DECODE: 16, PREFILL: 17}  # `] Decode batch. ` / `] Prefill batch. `
_ACCESS_LEN = 12
_DASH = b' - "'


@dataclass(slots=True)
class BatchLines:
    """Hot decode and prefill lines: index in the chunk, kind (DECODE/PREFILL), time, rank (index into
    `ranks`), and their fields by canonical name (float64, NaN where a line does not print one)."""

    index: np.ndarray
    kind: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    ranks: list[str]
    fields: dict[str, np.ndarray]


@dataclass(slots=True)
class AccessLines:
    """Hot access lines: index in the chunk, offset of the client (after `] INFO:     `), rank (index into
    the batch lines' `ranks`), and the first 24 bytes of each line as three words (its stamp)."""

    index: np.ndarray
    client: np.ndarray
    rank: np.ndarray
    head: list[np.ndarray]


@dataclass(slots=True)
class ScannedChunk:
    """A chunk's `lines` line bounds, which are `slow`, its hot batch lines, and its hot access lines (only
    counted by the analysis; `--export` reads their fields)."""

    starts: np.ndarray
    ends: np.ndarray
    slow: np.ndarray
    batch: BatchLines
    access_lines: AccessLines

    @property
    def access(self) -> int:
        return len(self.access_lines.index)

    @property
    def lines(self) -> int:
        return len(self.starts)


def scan_chunk(data: bytearray, size: int) -> ScannedChunk:
    """The hot lines of `data[:size]` (whole lines without the last newline, zero padding after)."""
    words = Words(data)
    starts, ends = line_bounds(words, size)
    slow = np.ones(len(starts), bool)
    candidate = (ends - starts) >= 32
    if not (bytearray.isascii(data) and b"\r" not in data and b"\x1b" not in data):
        candidate &= ~_dirty_lines(words, size, starts)
    rows = np.flatnonzero(candidate)
    head = window(words, starts[rows], HEAD)
    stamped, tag = _stamp_layout(head)
    tags = [word_at(head, tag + 8 * k) for k in range(MAX_TAG // 8 + 1)]
    close = _close_bracket(tags)
    label = tag + np.maximum(close, 0)
    kind = _labels(head, label)
    hot = np.flatnonzero(stamped & (close >= 0) & (kind >= 0))
    rows, kind, label, close = rows[hot], kind[hot], label[hot], close[hot]
    rank, ranks, named = _ranks(words, [t[hot] for t in tags[:3]], starts[rows] + tag[hot], close)
    access = np.flatnonzero((kind == ACCESS) & named)
    access = access[_access_layout(words, starts[rows[access]] + label[access])]
    slow[rows[access]] = False
    access_lines = AccessLines(rows[access], starts[rows[access]] + label[access] + _ACCESS_LEN,
                               rank[access].astype(np.int16), [h[hot[access]] for h in head[:3]])
    batch = np.flatnonzero((kind != ACCESS) & named)
    lines = _batch_lines(words, rows[batch], [h[hot[batch]] for h in head[:3]], kind[batch], rank[batch], ranks,
                         starts[rows[batch]] + label[batch], ends[rows[batch]])
    slow[lines.index] = False
    return ScannedChunk(starts, ends, slow, lines, access_lines)


_SCRATCH = threading.local()


def line_bounds(words: Words, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of every line of the chunk (no trailing newline)."""
    scratch = getattr(_SCRATCH, "flags", None)
    if scratch is None or len(scratch) < size:
        scratch = _SCRATCH.flags = np.empty(max(size, 1 << 20), bool)  # reused: no page faults per chunk
    flags = scratch[:size]
    np.equal(words.bytes[:size], 10, out=flags)
    newlines = np.flatnonzero(flags)
    starts = np.empty(len(newlines) + 1, np.int64)
    starts[0], starts[1:] = 0, newlines + 1
    ends = np.empty(len(newlines) + 1, np.int64)
    ends[:-1], ends[-1] = newlines, size
    return starts, ends


def _dirty_lines(words: Words, size: int, starts: np.ndarray) -> np.ndarray:
    """Lines holding a non-ASCII byte, CR or ESC (the per-line reader decodes and cleans those)."""
    body = words.bytes[:size]
    bad = np.flatnonzero((body >= 0x80) | (body == 13) | (body == 27))
    dirty = np.zeros(len(starts), bool)
    dirty[np.searchsorted(starts, bad, side="right") - 1] = True
    return dirty


# -- stamp --------------------------------------------------------------------------------------------

def _masks(offset: int) -> tuple[np.uint64, np.uint64, np.uint64]:
    """(mask of the stamp's fixed bytes, their value, mask of its digit bytes) in its word at `offset`."""
    fixed = value = digits = 0
    for k, c in enumerate(_STAMP[offset:offset + 8]):
        if c == ord("0"):
            digits |= 0xFF << (8 * k)
        else:
            fixed |= 0xFF << (8 * k)
            value |= c << (8 * k)
    return np.uint64(fixed), np.uint64(value), np.uint64(digits)


_MASKS = [_masks(offset) for offset in (0, 8, 16)]
_SEP = np.uint64(32)  # byte 20, after `[YYYY-mm-dd HH:MM:SS`, is the low byte of (word 2 >> 32)


def _stamp_layout(head: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the line starts with a stamp's layout, offset of its rank tag: 20, or 24 after `.fff`)."""
    good = np.ones(len(head[0]), bool)
    for word, (fixed, value, digits) in zip(head[:3], _MASKS):
        good &= ((word & fixed) == value) & all_digits(word, digits)
    sep = (head[2] >> _SEP) & np.uint64(0xFF)
    millis = (sep == np.uint64(ord("."))) & all_digits(head[2], np.uint64(0xFFFFFF << 40))
    good &= millis | (sep == np.uint64(ord(" "))) | (sep == np.uint64(ord("]")))
    return good, np.where(millis, 24, 20)


def _close_bracket(tags: list[np.ndarray]) -> np.ndarray:
    """Offset in the tag words of the first `]` within MAX_TAG bytes, -1 where there is none."""
    close = np.full(len(tags[0]), -1, np.int64)
    for k in range(len(tags) - 1, -1, -1):
        at = first_byte(tags[k], ord("]"))
        close = np.where(at < 8, 8 * k + at, close)
    close[close > MAX_TAG] = -1
    return close


def _labels(head: list[np.ndarray], label: np.ndarray) -> np.ndarray:
    """Kind per line from the text at its `]` (offset `label` in the head): DECODE, PREFILL, ACCESS or -1."""
    x0, x1 = word_at(head, label), word_at(head, label + 8)
    kind = np.full(len(label), -1, np.int8)
    b14, b15 = (x1 >> np.uint64(48)) & np.uint64(0xFF), x1 >> np.uint64(56)
    dot_or_comma = (b14 == np.uint64(ord("."))) | (b14 == np.uint64(ord(",")))
    decode = is_literal(x0, _DECODE[0]) & is_literal(x1, _DECODE[1]) & dot_or_comma & (b15 == np.uint64(32))
    prefill = is_literal(x0, _PREFILL[0]) & is_literal(x1, _PREFILL[1])
    prefill &= (b15 == np.uint64(ord("."))) | (b15 == np.uint64(ord(",")))
    prefill &= (word_at(head, label + 16) & np.uint64(0xFF)) == np.uint64(32)
    kind[decode] = DECODE
    kind[prefill] = PREFILL
    kind[is_literal(x0, _ACCESS[0]) & is_literal(x1, _ACCESS[1])] = ACCESS
    return kind


def stamp_times(head: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, the date is a calendar date) of hot lines from their first three words."""
    return _time(head)


def _time(head: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds on the log's clock, the date is a calendar date) from each stamp, as `diagnose.prefix`
    computes it: the time of day (plus milliseconds) added to the date's midnight."""
    w0, w1, w2 = head
    year = parse_digits(w0 >> np.uint64(8), 4)
    month, day = two_digits(w0, 6), two_digits(w1, 1)
    good = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
    tod = two_digits(w1, 4) * 3600 + (digit_at(w1, 7) * 10 + digit_at(w2, 0)) * 60 + two_digits(w2, 2)
    millis = ((w2 >> _SEP) & np.uint64(0xFF)) == np.uint64(ord("."))
    frac = np.where(millis, parse_digits(w2 >> np.uint64(40), 3) / 1000.0, 0.0)
    midnight = (_days(np.where(good, year, 1970), np.where(good, month, 1)) + np.where(good, day, 1) - 1) * 86400
    return midnight.astype(np.float64) + (tod + frac), good


def _days(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    """Days from 1970-01-01 to the first of each month (proleptic Gregorian, as `calendar.timegm`)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


# -- rank tag -----------------------------------------------------------------------------------------

_TAG_MASKS = np.array([[(1 << (8 * max(0, min(8, n - 8 * k)))) - 1 for k in range(3)] for n in range(MAX_TAG + 1)],
                      dtype=np.uint64)
_RANK_NAMES: dict[bytes, str | None] = {}


def _ranks(words: Words, tags: list[np.ndarray], tag: np.ndarray,
           length: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(code per line into the names, the names, the tag text is a rank tag), parsed per distinct text;
    `tags` are the tag's first words, `tag` its offset in the chunk, `length` its length."""
    masks = _TAG_MASKS[length]
    keys = [word & masks[:, k] for k, word in enumerate(tags)] + [length.astype(np.uint64)]
    codes, first = _distinct(keys)
    same = np.ones(len(tag), bool)
    for key in keys:
        same &= key == key[first][codes]
    texts = [bytes(words.bytes[t: t + n]) for t, n in zip(tag[first].tolist(), length[first].tolist())]
    names = [_rank_name(text) for text in texts]
    named = np.array([name is not None for name in names], bool)[codes] & same if len(first) else same
    return codes, [name or "" for name in names], named


def _distinct(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the rows by a 64-bit hash of `keys`, and the first row of each code (callers check rows
    against their code's first row: a hash collision then reads as a mismatch, never as a wrong match)."""
    mixed = np.zeros(len(keys[0]), np.uint64)
    for k, column in enumerate(keys):
        mixed = (mixed ^ column) * np.uint64(0x9E3779B97F4A7C15 + 2 * k)
    codes, first = np.full(len(mixed), -1, np.int64), []
    rest = np.arange(len(mixed))
    for code in range(FEW):
        if len(rest) == 0:
            return codes, np.array(first, np.int64)
        first.append(rest[0])
        same = mixed[rest] == mixed[rest[0]]
        codes[rest[same]] = code
        rest = rest[~same]
    _, first_index, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    return inverse.ravel(), first_index


def _rank_name(tag: bytes) -> str | None:
    """The rank a tag text names (`None` when it is not a rank tag), as `diagnose.prefix` normalises it."""
    name = _RANK_NAMES.get(tag, "?")
    if name == "?":
        text = tag.decode("ascii", "replace")
        name = " ".join(text.split()) if _RANK.fullmatch(text) else None
        if len(_RANK_NAMES) < 4096:
            _RANK_NAMES[tag] = name
    return name


# -- access and batch lines ---------------------------------------------------------------------------

def _access_layout(words: Words, label: np.ndarray) -> np.ndarray:
    """`] INFO:     CLIENT - "`: a client of 1-31 bytes without whitespace, then ` - "`."""
    if len(label) == 0:
        return np.zeros(0, bool)
    client = window(words, label + _ACCESS_LEN, MAX_CLIENT + 9)
    space = np.full(len(label), -1, np.int64)
    for k in range(MAX_CLIENT // 8, -1, -1):
        at = first_below(client[k], 0x21)
        space = np.where(at < 8, 8 * k + at, space)
    ok = (space >= 1) & (space <= MAX_CLIENT)
    return ok & is_literal(word_at(client, np.maximum(space, 0)), _DASH)


def _batch_lines(words: Words, rows: np.ndarray, head: list[np.ndarray], kind: np.ndarray, rank: np.ndarray,
                 ranks: list[str], label: np.ndarray, end: np.ndarray) -> BatchLines:
    """The batch lines whose pieces read completely and whose date is a calendar date."""
    time, dated = _time(head)
    read = np.zeros(len(rows), bool)
    fields: dict[str, np.ndarray] = {}
    for code in (DECODE, PREFILL):
        # NOTE: one walk per kind: its lines share their keys' order, so each step matches them as one group.
        mine = np.flatnonzero(kind == code)
        if not len(mine):
            continue
        got, values = read_pieces(words, label[mine] + _BODY[code], end[mine])
        read[mine] = got
        for name, column in values.items():
            if name not in fields:
                fields[name] = np.full(len(rows), np.nan)
            fields[name][mine] = column
    keep = read & dated
    return BatchLines(rows[keep].astype(np.int64), kind[keep].astype(np.int8), time[keep], rank[keep].astype(np.int16),
                      ranks, {name: values[keep] for name, values in fields.items()})
