"""Which lines of a chunk are hot, and their kind, time and rank, in vectorized operations.

A hot line starts `[YYYY-mm-dd HH:MM:SS(.fff)( TAGn)*] ` (SGLang's logger since 0.3.6, docs/log-formats.md §1),
directly or after an outer prefix (docker compose, CRI, Ray, journald: `outer`, read past before anything else),
and its message is a decode or prefill line whose pieces the field reader reads completely, or an HTTP access
line (counted only: the analysis keeps no access events), also vLLM's API server's access line after its process
prefix alone (no time); or vLLM's stats line in its common form (`fastpath.stats`). Every other line (any other
prefix, era, kind, garbled, non-ASCII or with CR, escape codes or pasted colour codes) is `slow`: the per-line
parser reads it, in order.

Each line's first `HEAD` bytes and the `LABEL` bytes at its `]` are gathered once, as rows of 64-bit words, and
read at fixed offsets. What a chunk repeats is worked out once per distinct value: a rank tag per distinct tag
text, a date's midnight per distinct date (a chunk holds a handful of each).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np

from toolkit.diagnose.read.batch import DECODE_LABEL, LABEL_ENDS, PREFILL_LABEL
from toolkit.diagnose.read.fastpath.fields import read_pieces
from toolkit.diagnose.read.fastpath.outer import BEFORE_ACCESS, outer_lengths
from toolkit.diagnose.read.fastpath.stats import StatsLines, stats_lines
from toolkit.diagnose.read.fastpath.words import (ONE, Words, all_digits, digit_at, first_below, first_byte, gather,
                                             is_literal, parse_digits, two_digits, window, word_at)
from toolkit.diagnose.read.messages import ACCESS_DASH, SGLANG_BATCH_KINDS, UVICORN_ACCESS
from toolkit.diagnose.read.prefix import DAY, RANK_TAGS, SGLANG_STAMP_LAYOUT, days_since_epoch, is_date, time_of_day
from toolkit.diagnose.read.rank import rank_name
from toolkit.diagnose.read.source import PASTED_RESET

DECODE, PREFILL, ACCESS = 0, 1, 2  # kind codes: SGLANG_BATCH_KINDS[code], then access lines
assert SGLANG_BATCH_KINDS[DECODE] == "decode" and SGLANG_BATCH_KINDS[PREFILL] == "prefill"
HEAD = 72      # bytes of each line read for its stamp, rank tag (the `]` is at most at 48) and label
LABEL = 24     # bytes read at the `]`: `] Decode batch. `, `] Prefill batch. `, `] INFO:     `
MAX_TAG = 24   # longest rank tag text read here (" DP1 PP0 TP3 EP3" is 16); longer ones take the per-line path
MAX_CLIENT = 31
FEW = 8        # distinct values matched one by one before sorting
_RANK = re.compile(RANK_TAGS + r"\s*")
_DECODE = f"] {DECODE_LABEL}".encode()
_PREFILL = f"] {PREFILL_LABEL}".encode()
_ACCESS = f"] {UVICORN_ACCESS}".encode()
_BODY = np.array([len(_DECODE) + 2, len(_PREFILL) + 2])  # past `] Decode batch. ` / `] Prefill batch. `, by kind
_ACCESS_LEN = len(_ACCESS)
_DASH = ACCESS_DASH.encode()
assert max(len(_DECODE), len(_PREFILL)) + 2 <= LABEL and len(_ACCESS) <= LABEL, "labels fit the bytes read"
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_PASTED_RESET = PASTED_RESET.encode()
_BYTE = np.uint64(0xFF)


@dataclass(slots=True)
class BatchLines:
    """Hot decode and prefill lines, the decode lines first, each kind in line order: index in the chunk, kind
    (DECODE/PREFILL), time, rank (index into `ranks`), and their fields by canonical name (float64, NaN where a
    line does not print one)."""

    index: np.ndarray
    kind: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    ranks: list[str]
    fields: dict[str, np.ndarray]
    label: np.ndarray  # offset of each line's `]` in the chunk (its message starts 2 bytes on)

    def by_kind(self) -> dict[str, dict[str, np.ndarray]]:
        """The lines as table columns by kind name: `line` (index in the chunk), `time`, `rank` (index into
        `ranks`) and every field some line of the kind prints."""
        out = {}
        bounds = np.searchsorted(self.kind, [DECODE, PREFILL, PREFILL + 1]).tolist()
        for code, kind in enumerate(SGLANG_BATCH_KINDS):
            a, b = bounds[code], bounds[code + 1]
            if a == b:
                continue
            columns = {"line": self.index[a:b], "time": self.time[a:b], "rank": self.rank[a:b]}
            for name, values in self.fields.items():
                if not np.isnan(values[a:b]).all():
                    columns[name] = values[a:b]
            out[kind] = columns
        return out


@dataclass(slots=True)
class AccessLines:
    """Hot access lines in line order: index in the chunk, offset of the client (after `] INFO:     `), rank
    (index into the batch lines' `ranks`), the first 24 bytes of each line's stamp as three words, and whether it
    has a stamp (vLLM's API server prints `(APIServer pid=N) INFO:     ...`, no time; its head words are 0)."""

    index: np.ndarray
    client: np.ndarray
    rank: np.ndarray
    head: list[np.ndarray]
    timed: np.ndarray

    @property
    def untimed(self) -> np.ndarray:
        """Indices in the chunk of the lines without a stamp."""
        return self.index[~self.timed]


@dataclass(slots=True)
class StampedLines:
    """Slow lines that start (after an outer prefix) with a whole dated SGLang stamp, `[date time( TAGn)*] `, in
    line order: index in the chunk, offset in the chunk of the message after the stamp, and whether the date is a
    calendar date. The per-line parser's `FIRST_STAMP` ends where each message starts (`plain.stamped_plain`)."""

    index: np.ndarray
    message: np.ndarray
    dated: np.ndarray


@dataclass(slots=True)
class ScannedChunk:
    """A chunk's `lines` line bounds, which are `slow`, its hot batch lines, its hot access lines (only
    counted by the analysis; `--export` reads their fields), the slow lines behind a whole SGLang stamp, and
    vLLM's stats lines (hot: read by `fastpath.stats`)."""

    starts: np.ndarray
    ends: np.ndarray
    slow: np.ndarray
    batch: BatchLines
    access_lines: AccessLines
    stamped: StampedLines
    stats: StatsLines

    def columns(self) -> tuple[dict[str, dict[str, np.ndarray]], list[str]]:
        """The hot batch and stats lines as table columns by kind (`BatchLines.by_kind`; stats lines as kind
        "stats", their time before the clock's wraps), and the rank names their codes index."""
        columns, ranks = self.batch.by_kind(), self.batch.ranks
        stats = self.stats
        if len(stats.index):
            ranks = ranks + [name for name in stats.ranks if name not in ranks]
            codes = np.array([ranks.index(name) for name in stats.ranks], np.int16)
            columns["stats"] = {"line": stats.index, "time": stats.time, "rank": codes[stats.rank], **stats.fields}
        return columns, ranks

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
    resets = _pasted_resets(words, size)
    if words.bytes[:size].max(initial=0) >= 0x80 or b"\r" in data or b"\x1b" in data or len(resets):
        candidate &= ~_dirty_lines(words, size, starts, resets)
    rows = np.flatnonzero(candidate)
    at = starts[rows]
    skip = outer_lengths(words, at)
    if skip.any():
        at = at + skip
        long_enough = np.flatnonzero((ends[rows] - at) >= 32)
        rows, at = rows[long_enough], at[long_enough]
    head = np.ascontiguousarray(gather(words, at, HEAD).T)  # word k of every line is head[k]
    stamped, _ = _stamp_layout(head)
    if not stamped.all():
        stamped = np.flatnonzero(stamped)
        rows, at, head = rows[stamped], at[stamped], head[:, stamped]
    layout = _layouts(words, head, at)
    whole = np.flatnonzero(layout.message >= 0)
    whole_rows, whole_message, whole_head = rows[whole], at[whole] + layout.message[whole], head[:2, whole]
    kind, close, rank = layout.kind, layout.close, layout.rank
    if not layout.hot.all():
        hot = np.flatnonzero(layout.hot)
        rows, at, head, kind, close, rank = rows[hot], at[hot], head[:, hot], kind[hot], close[hot], rank[hot]
    access = np.flatnonzero(kind == ACCESS)
    access = access[_access_layout(words, at[access] + close[access])]
    slow[rows[access]] = False
    access_lines = AccessLines(rows[access], at[access] + close[access] + _ACCESS_LEN, rank[access].astype(np.int16),
                               list(head[:3, access]), np.ones(len(access), bool))
    batch = np.flatnonzero(kind == DECODE)
    batch = np.concatenate([batch, np.flatnonzero(kind == PREFILL)])
    lines = _batch_lines(words, rows[batch], head[:3, batch], kind[batch], rank[batch], layout.ranks,
                         at[batch] + close[batch], ends[rows[batch]])
    slow[lines.index] = False
    timeless, client = _timeless_access(words, starts, np.flatnonzero(slow & candidate))
    if len(timeless):
        slow[timeless] = False
        access_lines = _with_timeless(access_lines, timeless, client, layout.ranks)
    stats = stats_lines(data, size, starts, ends, slow & candidate)
    slow[stats.index] = False
    return ScannedChunk(starts, ends, slow, lines, access_lines, _stamped(whole_rows, whole_message, whole_head, slow),
                        stats)


def _stamped(rows: np.ndarray, message: np.ndarray, head: np.ndarray, slow: np.ndarray) -> StampedLines:
    """The slow ones of the lines behind a whole stamp, with their message offsets and whether their date is a
    calendar date (worked out per distinct date)."""
    keep = np.flatnonzero(slow[rows])
    rows, message, w0, w1 = rows[keep], message[keep], head[0][keep], head[1][keep]
    if len(rows) == 0:
        return StampedLines(rows, message, np.zeros(0, bool))
    date = [w0, w1 & _DATE]
    codes, first = _distinct(date)
    _, good = _midnight(w0[first], w1[first])
    dated = good[codes] & (w0 == w0[first][codes]) & (date[1] == date[1][first][codes])
    other = np.flatnonzero(~dated)
    if len(other):
        dated[other] = _midnight(w0[other], w1[other])[1]
    return StampedLines(rows, message, dated)


# -- layouts: a chunk's lines share a few (stamp form, rank tag, label) ---------------------------------

@dataclass(slots=True)
class Layout:
    """Per line: hot (a batch or access line with a rank tag), kind, offset of its `]`, rank (index into
    `ranks`), offset of its message where the stamp up to that `]` is a whole SGLang stamp (rank tags, at most
    MAX_TAG bytes of them), else -1."""

    hot: np.ndarray
    kind: np.ndarray
    close: np.ndarray
    rank: np.ndarray
    ranks: list[str]
    message: np.ndarray


@dataclass(frozen=True, slots=True)
class _Template:
    """A line's bytes up to the end of its label, digits of the stamp left out, as (value, mask) words: every
    line with the same bytes there and digits in its stamp reads the same (stamp form, tag, `]`, label)."""

    value: tuple[np.uint64, ...]
    mask: tuple[np.uint64, ...]
    hot: bool
    kind: int
    close: int
    rank: str
    message: int

    def matches(self, head: np.ndarray) -> np.ndarray:
        """Which lines match, from their head words 2 on (the stamp's fixed bytes before byte 20 are checked
        already)."""
        ok = None
        for k in range(2, len(self.value)):
            same = (head[k] & self.mask[k]) == self.value[k]
            ok = same if ok is None else ok & same
        return ok


MAX_LAYOUTS = 12
_DIGITS = tuple(k for k, c in enumerate(SGLANG_STAMP_LAYOUT) if c == ord("0"))  # `.fff` adds 21-23
_TEMPLATES: dict[bytes, _Template] = {}


def _layouts(words: Words, head: np.ndarray, at: np.ndarray) -> Layout:
    """The layout of each stamped line: lines are matched against templates made from the first line no
    template matches yet (a chunk needs a handful); lines past MAX_LAYOUTS templates are read one by one."""
    n = head.shape[1]
    code = np.zeros(n, np.int8)  # 1 + the template a line matches (templates never overlap: their `]` differ)
    templates: list[_Template] = []
    first, matched = 0, 0
    while matched < n and len(templates) < MAX_LAYOUTS:
        template = _template(words, head[:, first], at[first])
        match = template.matches(head)
        templates.append(template)
        code += match.view(np.int8) * np.int8(len(templates))
        matched += int(np.count_nonzero(match))
        first = int(code.argmin())
    left = np.flatnonzero(code == 0) if matched < n else np.zeros(0, np.int64)
    ranks = list(dict.fromkeys(t.rank for t in templates))
    table = np.array([(0, 0, 0, 0, -1)] + [(t.hot, t.kind, t.close, ranks.index(t.rank), t.message)
                                            for t in templates], np.int64)
    layout = Layout(table[:, 0].astype(bool)[code], table[:, 1][code], table[:, 2][code], table[:, 3][code], ranks,
                    table[:, 4][code])
    if len(left):
        rest = _classify(words, head[:, left], at[left])
        for name in rest.ranks:
            if name not in ranks:
                ranks.append(name)
        codes = np.array([ranks.index(name) for name in rest.ranks] or [0], np.int64)
        layout.hot[left], layout.kind[left], layout.close[left] = rest.hot, rest.kind, rest.close
        layout.rank[left], layout.message[left] = codes[rest.rank], rest.message
    return layout


def _template(words: Words, head: np.ndarray, at: np.int64) -> _Template:
    """The template of one stamped line (its head words), made once per process for each distinct one."""
    row = head.tobytes()
    close = row.find(b"]", 20, HEAD - 16)
    end = min(close + 17, HEAD) if close >= 0 else HEAD - 16
    digits = _DIGITS + ((21, 22, 23) if row[20:21] == b"." else ())
    region, mask = bytearray(row[:end]), bytearray(b"\xff" * end)
    for k in digits:
        region[k] = mask[k] = 0
    key = bytes(region)
    template = _TEMPLATES.get(key)
    if template is None:
        one = _classify(words, head[:, None], np.array([at]))
        template = _Template(_as_words(region), _as_words(mask), bool(one.hot[0]), int(one.kind[0]),
                             int(one.close[0]), one.ranks[one.rank[0]] if one.ranks else "", int(one.message[0]))
        if len(_TEMPLATES) < 4096:
            _TEMPLATES[key] = template
    return template


def _as_words(data: bytearray) -> tuple[np.uint64, ...]:
    return tuple(np.frombuffer(bytes(data) + bytes(-len(data) % 8), np.uint64))


def _classify(words: Words, head: np.ndarray, at: np.ndarray) -> Layout:
    """The layout of each stamped line, read line by line from its head and label."""
    _, tag = _stamp_layout(head)
    close = _close_bracket(head)
    kind = _labels(gather(words, at + np.minimum(close, HEAD), LABEL))
    fits = close - tag <= MAX_TAG
    hot = fits & (kind >= 0)
    rank, ranks, named = _ranks(words, head, at, tag, np.where(hot, close, tag))
    return Layout(hot & named, kind.astype(np.int64), close, rank, ranks, _message(words, head, at, tag, close, fits))


def _message(words: Words, head: np.ndarray, at: np.ndarray, tag: np.ndarray, close: np.ndarray,
             fits: np.ndarray) -> np.ndarray:
    """Offset of each line's message where its stamp up to `close` is a whole SGLang stamp (`\\] ?` after rank
    tags that fit), else -1."""
    _, _, tags = _ranks(words, head, at, tag, np.where(fits, close, tag))
    after = words.bytes[at + np.minimum(close, HEAD) + 1]
    return np.where(fits & tags, close + 1 + (after == ord(" ")), -1)


_SCRATCH = threading.local()


def line_bounds(words: Words, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of every line of the chunk (no trailing newline): newlines flagged, packed eight
    to a byte, and the set bits of each 64-bit word read out (a word rarely holds more than one newline)."""
    padded = (size + 63) // 64 * 64
    scratch = getattr(_SCRATCH, "flags", None)
    if scratch is None or len(scratch) < padded:
        scratch = _SCRATCH.flags = np.zeros(max(padded, 1 << 20), bool)  # reused: no page faults per chunk
    flags = scratch[:padded]
    np.equal(words.bytes[:size], 10, out=flags[:size])
    flags[size:] = False
    packed = np.packbits(flags, bitorder="little").view(np.uint64)
    which = np.flatnonzero(packed != 0)
    bits, base = packed[which], which * 64
    newlines = []
    while len(bits):
        low = bits & (~bits + ONE)
        newlines.append(base + np.bitwise_count(low - ONE))
        bits ^= low
        more = bits != 0
        if not more.any():
            break
        bits, base = bits[more], base[more]
    found = np.concatenate(newlines) if len(newlines) > 1 else (newlines[0] if newlines else np.zeros(0, np.int64))
    if len(newlines) > 1:
        found.sort(kind="stable")
    starts = np.empty(len(found) + 1, np.int64)
    starts[0], starts[1:] = 0, found + 1
    ends = np.empty(len(found) + 1, np.int64)
    ends[:-1], ends[-1] = found, size
    return starts, ends


def _pasted_resets(words: Words, size: int) -> np.ndarray:
    """Where the chunk holds a pasted colour code's reset, `[0m`: found from its last byte (rarer in a log than
    its first, `[`, which opens every stamp; `bytes.find` is 3x slower here)."""
    body = words.bytes[:size]
    last = np.flatnonzero(body[2:] == _PASTED_RESET[2])
    return last[(body[last] == _PASTED_RESET[0]) & (body[last + 1] == _PASTED_RESET[1])]


def _dirty_lines(words: Words, size: int, starts: np.ndarray, resets: np.ndarray) -> np.ndarray:
    """Lines holding a non-ASCII byte, CR, ESC or a pasted colour code's reset (at `resets`; the per-line reader
    decodes and cleans those)."""
    body = words.bytes[:size]
    bad = np.concatenate([np.flatnonzero((body >= 0x80) | (body == 13) | (body == 27)), resets])
    dirty = np.zeros(len(starts), bool)
    dirty[np.searchsorted(starts, bad, side="right") - 1] = True
    return dirty


# -- stamp --------------------------------------------------------------------------------------------

def _masks(offset: int) -> tuple[np.uint64, np.uint64, np.uint64]:
    """(mask of the stamp's fixed bytes, their value, mask of its digit bytes) in its word at `offset`."""
    fixed = value = digits = 0
    for k, c in enumerate(SGLANG_STAMP_LAYOUT[offset:offset + 8]):
        if c == ord("0"):
            digits |= 0xFF << (8 * k)
        else:
            fixed |= 0xFF << (8 * k)
            value |= c << (8 * k)
    return np.uint64(fixed), np.uint64(value), np.uint64(digits)


_MASKS = [_masks(offset) for offset in (0, 8, 16)]
_SEP = np.uint64(32)  # byte 20, after `[YYYY-mm-dd HH:MM:SS`, is the low byte of (word 2 >> 32)


def _stamp_layout(head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the line starts with a stamp's layout, offset of its rank tag: 20, or 24 after `.fff`)."""
    good = np.ones(head.shape[1], bool)
    for k, (fixed, value, digits) in enumerate(_MASKS):
        word = head[k]
        good &= ((word & fixed) == value) & all_digits(word, digits)
    sep = (head[2] >> _SEP) & np.uint64(0xFF)
    millis = (sep == np.uint64(ord("."))) & all_digits(head[2], np.uint64(0xFFFFFF << 40))
    good &= millis | (sep == np.uint64(ord(" "))) | (sep == np.uint64(ord("]")))
    return good, np.where(millis, 24, 20)


def _close_bracket(head: np.ndarray) -> np.ndarray:
    """Offset of the first `]` at or after byte 20 of each line's head (its stamp holds none before), a large
    offset where the head has none."""
    close = np.full(head.shape[1], 1 << 20, np.int64)
    for k in range(HEAD // 8 - 3, 1, -1):
        at = first_byte(head[k], ord("]"))
        close = np.where(at < 8, 8 * k + at, close)
    return close


def _labels(label: np.ndarray) -> np.ndarray:
    """Kind per line from the `LABEL` bytes at its `]`: DECODE, PREFILL, ACCESS or -1. A batch label is followed
    by one of `LABEL_ENDS` and a space (`] Decode batch. `); the access label is uvicorn's `] INFO:     `."""
    kind = np.full(len(label), -1, np.int8)
    kind[_starts_with(label, _DECODE) & _label_end(label, len(_DECODE))] = DECODE
    kind[_starts_with(label, _PREFILL) & _label_end(label, len(_PREFILL))] = PREFILL
    kind[_starts_with(label, _ACCESS)] = ACCESS
    return kind


def _starts_with(label: np.ndarray, text: bytes) -> np.ndarray:
    ok = is_literal(label[:, 0], text[:8])
    for k in range(8, len(text), 8):
        ok &= is_literal(label[:, k // 8], text[k: k + 8])
    return ok


def _byte_at(label: np.ndarray, k: int) -> np.ndarray:
    return (label[:, k // 8] >> np.uint64(8 * (k % 8))) & _BYTE


def _label_end(label: np.ndarray, k: int) -> np.ndarray:
    end = _byte_at(label, k)
    ok = end == np.uint64(ord(LABEL_ENDS[0]))
    for c in LABEL_ENDS[1:]:
        ok |= end == np.uint64(ord(c))
    return ok & (_byte_at(label, k + 1) == np.uint64(ord(" ")))


def stamp_times(head: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, the date is a calendar date) of hot lines from their first three words."""
    return _time(np.stack(head) if len(head[0]) else np.zeros((3, 0), np.uint64))


_DATE = np.uint64(0xFFFFFF)  # bytes 8-10 of a stamp, `-dd`: with word 0, the date


def _time(head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds on the log's clock, the date is a calendar date) from each stamp, by the rule of
    `diagnose.read.prefix`: the time of day (plus milliseconds) added to the date's midnight (worked out
    per distinct date)."""
    w0, w1, w2 = head[0], head[1], head[2]
    if len(w0) == 0:
        return np.zeros(0), np.zeros(0, bool)
    date = [w0, w1 & _DATE]
    codes, first = _distinct(date)
    midnight, good = _midnight(w0[first], w1[first])
    midnight, good = midnight[codes], good[codes]
    other = np.flatnonzero((date[0] != date[0][first][codes]) | (date[1] != date[1][first][codes]))
    if len(other):
        midnight[other], good[other] = _midnight(w0[other], w1[other])
    tod = time_of_day(two_digits(w1, 4), digit_at(w1, 7) * 10 + digit_at(w2, 0), two_digits(w2, 2))
    millis = ((w2 >> _SEP) & np.uint64(0xFF)) == np.uint64(ord("."))
    if millis.any():
        tod = tod + np.where(millis, parse_digits(w2 >> np.uint64(40), 3) / 1000.0, 0.0)
    return midnight + tod, good


def _midnight(w0: np.ndarray, w1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds at the date's midnight, the date is a calendar date) of stamps' first two words."""
    year = parse_digits(w0 >> np.uint64(8), 4)
    month, day = two_digits(w0, 6), two_digits(w1, 1)
    good = is_date(year, month, day)
    days = days_since_epoch(np.where(good, year, 1970), np.where(good, month, 1), np.where(good, day, 1))
    return days * DAY, good


# -- rank tag -----------------------------------------------------------------------------------------

_RANK_NAMES: dict[bytes, str | None] = {}


def _below(offset: np.ndarray) -> np.ndarray:
    """Masks of each word's bytes before `offset` (counted from the word's first byte; any integer)."""
    keep = np.clip(offset, 0, 8)
    return (_ALL >> ((8 - keep) * 8).astype(np.uint64)) if len(offset) else np.zeros(0, np.uint64)


def _ranks(words: Words, head: np.ndarray, at: np.ndarray, tag: np.ndarray,
           close: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(code per line into the names, the names, the tag text is a rank tag), parsed per distinct text; the
    tag text is bytes [tag, close) of each line's head (at most MAX_TAG, within words 2-5)."""
    if len(at) == 0:
        return np.zeros(0, np.int64), [], np.zeros(0, bool)
    low = np.where(tag == 20, np.uint64(0xFFFFFFFF00000000), np.uint64(0))
    keys = [head[2] & low & _below(close - 16)]
    keys += [head[k] & _below(close - 8 * k) for k in range(3, 6)]
    keys.append((tag * 64 + close).astype(np.uint64))
    codes, first = _distinct(keys)
    same = np.ones(len(at), bool)
    for key in keys:
        same &= key == key[first][codes]
    begin = (at + tag)[first].tolist()
    texts = [bytes(words.bytes[b: b + n]) for b, n in zip(begin, (close - tag)[first].tolist())]
    names = [_rank_name(text) for text in texts]
    named = np.array([name is not None for name in names], bool)[codes] & same
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
    """The rank a tag text names (`None` when it is not a rank tag), named by `read.rank.rank_name`."""
    name = _RANK_NAMES.get(tag, "?")
    if name == "?":
        text = tag.decode("ascii", "replace")
        name = rank_name(text) if _RANK.fullmatch(text) else None
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


def _timeless_access(words: Words, starts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, client offset) of vLLM's access lines without a time: `(APIServer pid=N) INFO:     CLIENT - "`,
    a client of 1-31 bytes without whitespace or `[` (where the per-line parser would look for a stamp)."""
    skip = outer_lengths(words, starts[rows], BEFORE_ACCESS)
    rows = rows[skip > 0]
    client = starts[rows] + skip[skip > 0] + len(UVICORN_ACCESS)
    if len(rows) == 0:
        return rows, client
    ok = _access_layout(words, client - _ACCESS_LEN)
    columns = window(words, client, MAX_CLIENT + 9)
    space, bracket = np.full(len(rows), -1, np.int64), np.full(len(rows), 1 << 20, np.int64)
    for k in range(len(columns) - 1, -1, -1):
        at = first_below(columns[k], 0x21)
        space = np.where(at < 8, 8 * k + at, space)
        at = first_byte(columns[k], ord("["))
        bracket = np.where(at < 8, 8 * k + at, bracket)
    ok &= bracket > space
    return rows[ok], client[ok]


def _with_timeless(lines: AccessLines, index: np.ndarray, client: np.ndarray, ranks: list[str]) -> AccessLines:
    """The stamped access lines and the timeless ones (rank `""`, added to `ranks` where it lacks it), in line
    order."""
    if "" not in ranks:
        ranks.append("")
    n = len(index)
    order = np.argsort(np.concatenate([lines.index, index]), kind="stable")
    zeros = np.zeros(n, np.uint64)
    return AccessLines(np.concatenate([lines.index, index])[order], np.concatenate([lines.client, client])[order],
                       np.concatenate([lines.rank, np.full(n, ranks.index(""), np.int16)])[order],
                       [np.concatenate([word, zeros])[order] for word in lines.head],
                       np.concatenate([lines.timed, np.zeros(n, bool)])[order])


def _batch_lines(words: Words, rows: np.ndarray, head: np.ndarray, kind: np.ndarray, rank: np.ndarray,
                 ranks: list[str], label: np.ndarray, end: np.ndarray) -> BatchLines:
    """The batch lines whose pieces read completely and whose date is a calendar date."""
    time, dated = _time(head)
    read, fields = read_pieces(words, label + _BODY[kind], end, (int(np.searchsorted(kind, PREFILL)),))
    keep = np.flatnonzero(read & dated)
    return BatchLines(rows[keep].astype(np.int64), kind[keep].astype(np.int8), time[keep], rank[keep].astype(np.int16),
                      ranks, {name: values[keep] for name, values in fields.items()}, label[keep])
