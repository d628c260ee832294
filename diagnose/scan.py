"""Block scanner: the hot lines of a raw block, classified in vectorized numpy operations.

A hot line here is a decode, prefill or HTTP access line in the layout SGLang's logger writes since 0.3.6,
`[YYYY-mm-dd HH:MM:SS[.fff]( TAGn)*] Label...`, at the start of the line. For those, kind, time, rank and
line number come out exactly as the per-line parser would give them; every other line (any other prefix,
era, kind, garbled or non-ASCII text) is marked `slow` and left to the per-line parser, in order.

Each line's first HEAD bytes are read as six 64-bit little-endian words; the stamp and rank tag are parsed
once per distinct tag text (a block holds a few hundred), labels are compared eight bytes at a time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


KINDS = np.array(["decode", "prefill", "access"], dtype=object)
DECODE, PREFILL, ACCESS = 0, 1, 2
HEAD = 48     # bytes of each line read for its stamp and rank tag
TAG = 20      # the rank tag starts after `[YYYY-mm-dd HH:MM:SS` (24 with `.fff`)
MAX_TAG = 24  # longest rank tag text read here (" DP1 PP0 TP3 EP3" is 16); longer ones take the per-line path
FEW = 8       # distinct tag texts matched one by one before sorting
_RANK = re.compile(r"(?:\s+[A-Z][A-Z_]*\d+)*\s*")
_DECODE = b"] Decode batch"
_DECODE_NEXT = b" #running-req: "
_PREFILL = b"] Prefill batch"
_ACCESS = b"] INFO:     "
_LABEL_LENGTHS = np.array([len(_DECODE) + 2, len(_PREFILL) + 2, len(_ACCESS)])  # `] Decode batch. `


@dataclass(slots=True)
class FastLines:
    """The block's hot lines (`index` into the block's lines, ascending) and which lines are not hot."""

    index: np.ndarray
    kind: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    start: np.ndarray
    end: np.ndarray
    body: np.ndarray  # byte offset after the label: `] Label. ` for batch lines, `] INFO:     ` for access
    slow: np.ndarray
    line_starts: np.ndarray
    line_ends: np.ndarray
    raw: Bytes
    routed: list[int] = field(default_factory=list)  # hot lines the parser read line by line (as rows)

    def rows(self, text: str, lo: int, hi: int, first_line: int, source: int) -> list[tuple]:
        """Parser rows `(kind, line, time, rank, text, source)` of hot lines lo..hi; `text` is the block."""
        texts = map(text.__getitem__, map(slice, self.start[lo:hi].tolist(), self.end[lo:hi].tolist()))
        return list(zip(KINDS[self.kind[lo:hi]].tolist(), (self.index[lo:hi] + first_line).tolist(),
                        self.time[lo:hi].tolist(), self.rank[lo:hi].tolist(), texts, repeat(source)))


class Bytes:
    """Fixed-width rows of the bytes of `data`, read from any offsets; bytes past its end read as zero."""

    PAD = 128

    def __init__(self, data: bytes) -> None:
        self.data = np.frombuffer(data + bytes(self.PAD), np.uint8)
        self._word = np.ndarray((len(self.data) - 7,), np.dtype("<u8"), self.data, 0, (1,))

    def words(self, pos: np.ndarray, count: int) -> np.ndarray:
        """The `count` little-endian 64-bit words starting at each offset in `pos`, one row each."""
        if count == 1:
            return self._word[np.minimum(pos, len(self._word) - 1)][:, None]
        windows = sliding_window_view(self.data, 8 * count)
        return windows[np.minimum(pos, len(windows) - 1)].view("<u8")


def line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end byte offsets of every line of a block (no trailing newline)."""
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(data)]))
    return starts, ends


def scan(data: bytes) -> FastLines | None:
    """The hot lines of `data` (lines without the last newline); None when the block is not plain ASCII text
    without CR or escape codes, which the per-line reader cleans first."""
    if not data.isascii() or b"\r" in data or b"\x1b" in data:
        return None
    starts, ends = line_bounds(data)
    raw = Bytes(data)
    head = raw.words(starts, HEAD // 8)
    close = first_byte(head, ord("]"), TAG)
    close = np.where(close < ends - starts, close, -1)
    kind = _labels(raw, starts + np.maximum(close, 0), close >= 0)
    time, rank, good = _stamps(data, head, starts, close)
    kind[~good] = -1
    _verify(data, raw, kind, starts, ends, close)
    hot = np.flatnonzero(kind >= 0)
    body = starts[hot] + close[hot] + _LABEL_LENGTHS[kind[hot]]
    return FastLines(hot, kind[hot], time[hot], rank[hot], starts[hot], ends[hot], body, kind < 0, starts, ends,
                     raw)


# -- bytes in words -------------------------------------------------------------------------------------

_ONES, _HIGHS = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)


def first_byte(words: np.ndarray, byte: int, skip: int = 0) -> np.ndarray:
    """Offset of the first `byte` at or after `skip` in each row of words, -1 where there is none."""
    found = np.full(len(words), -1, np.int64)
    pattern = np.uint64(byte * 0x0101010101010101)
    for k in range(words.shape[1] - 1, skip // 8 - 1, -1):
        word = words[:, k] | _keep_from(skip - 8 * k) if 8 * k < skip else words[:, k]
        x = word ^ pattern
        zero = (x - _ONES) & ~x & _HIGHS
        # NOTE: the lowest flagged byte is exact (a borrow only flags bytes above a real zero byte).
        lowest = zero & (~zero + np.uint64(1))
        hit = zero != 0
        found[hit] = 8 * k + np.log2(lowest[hit].astype(np.float64)).astype(np.int64) // 8
    return found


def _keep_from(first: int) -> np.uint64:
    """Bits to OR into a word so that its bytes before `first` cannot match a searched byte (< 0xFF)."""
    return np.uint64((1 << (8 * first)) - 1) if first > 0 else np.uint64(0)


def has_literal(words: np.ndarray, literal: bytes, offset: int = 0) -> np.ndarray:
    """Whether `literal` is at byte `offset` of each row of words."""
    ok = np.ones(len(words), bool)
    for k in range(0, len(literal), 8):
        piece = literal[k:k + 8]
        mask = np.uint64((1 << (8 * len(piece))) - 1)
        ok &= (_word_at(words, offset + k) & mask) == np.uint64(int.from_bytes(piece, "little"))
    return ok


def _word_at(words: np.ndarray, offset: int) -> np.ndarray:
    i, r = divmod(offset, 8)
    if r == 0:
        return words[:, i]
    return (words[:, i] >> np.uint64(8 * r)) | (words[:, i + 1] << np.uint64(64 - 8 * r))


def _byte_at(words: np.ndarray, offset: int) -> np.ndarray:
    return (words[:, offset // 8] >> np.uint64(8 * (offset % 8))) & np.uint64(0xFF)


# -- labels ---------------------------------------------------------------------------------------------

def _dot_or_comma(words: np.ndarray, offset: int) -> np.ndarray:
    byte = _byte_at(words, offset)
    return (byte == np.uint64(ord("."))) | (byte == np.uint64(ord(",")))


def _labels(raw: Bytes, close: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """Kind code per line from the label after the `]` at `close` (-1: not a hot line)."""
    words = raw.words(close, 4)
    dec = has_literal(words, _DECODE) & _dot_or_comma(words, len(_DECODE))
    dec &= has_literal(words, _DECODE_NEXT, len(_DECODE) + 1)
    pre = has_literal(words, _PREFILL) & _dot_or_comma(words, len(_PREFILL))
    kind = np.full(len(close), -1, np.int8)
    kind[closed & dec] = DECODE
    kind[closed & pre] = PREFILL
    kind[closed & has_literal(words, _ACCESS)] = ACCESS
    return kind


# -- stamp and rank ------------------------------------------------------------------------------------

_STAMP = b"[0000-00-00 00:00:00"


def _word_masks(offset: int) -> tuple[np.uint64, np.uint64, np.uint64]:
    """(mask of the stamp's fixed bytes, their value, mask of its digit bytes) in the stamp's word at offset."""
    fixed = value = digits = 0
    for k, c in enumerate(_STAMP[offset:offset + 8]):
        if c == ord("0"):
            digits |= 0xFF << (8 * k)
        else:
            fixed |= 0xFF << (8 * k)
            value |= c << (8 * k)
    return np.uint64(fixed), np.uint64(value), np.uint64(digits)


_MASKS = [_word_masks(offset) for offset in (0, 8, 16)]


def _all_digits(word: np.ndarray, digits: np.uint64) -> np.ndarray:
    """Whether every byte of `word` under the `digits` mask is an ASCII digit."""
    high = digits & np.uint64(0xF0F0F0F0F0F0F0F0)
    threes = digits & np.uint64(0x3030303030303030)
    sixes = digits & np.uint64(0x0606060606060606)
    return ((word & high) == threes) & ((((word & digits) + sixes) & high) == threes)


def _digit(word: np.ndarray, k: int) -> np.ndarray:
    return ((word >> np.uint64(8 * k)) & np.uint64(0x0F)).astype(np.int64)


def _days(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    """Days from 1970-01-01 to the first of each month (proleptic Gregorian, as `calendar.timegm`)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _stamps(data: bytes, head: np.ndarray, starts: np.ndarray, close: np.ndarray):
    """(time, rank, the stamp is a good dated one) per line, from the text before its `]`."""
    w0, w1, w2, w3 = (np.ascontiguousarray(head[:, k]) for k in range(4))
    good = close >= 0
    for word, (fixed, value, digits) in zip((w0, w1, w2), _MASKS):
        good &= ((word & fixed) == value) & _all_digits(word, digits)
    year = _digit(w0, 1) * 1000 + _digit(w0, 2) * 100 + _digit(w0, 3) * 10 + _digit(w0, 4)
    month, day = _digit(w0, 6) * 10 + _digit(w0, 7), _digit(w1, 1) * 10 + _digit(w1, 2)
    good &= (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
    tod = (_digit(w1, 4) * 10 + _digit(w1, 5)) * 3600 + (_digit(w1, 7) * 10 + _digit(w2, 0)) * 60
    tod += _digit(w2, 2) * 10 + _digit(w2, 3)
    sep = (w2 >> np.uint64(32)) & np.uint64(0xFF)
    millis = ((sep == np.uint64(ord("."))) | (sep == np.uint64(ord(",")))) & _all_digits(w2, np.uint64(0xFFFFFF << 40))
    millis &= ~_all_digits(w3, np.uint64(0xFF))
    frac = np.where(millis, (_digit(w2, 5) * 100 + _digit(w2, 6) * 10 + _digit(w2, 7)) / 1000.0, 0.0)
    midnight = (_days(np.where(good, year, 1970), np.where(good, month, 1)) + np.where(good, day, 1) - 1) * 86400
    # NOTE: the per-line reader adds the fraction to the time of day before the date, in float arithmetic.
    time = midnight.astype(np.float64) + (tod + frac)
    rank, named = _ranks(data, head, starts, np.where(millis, TAG + 4, TAG), close)
    return time, rank, good & named


# Per tag length (-1..MAX_TAG, index length + 1) and word k, the mask of the word's bytes inside the tag.
_TAG_MASKS = np.array([[(1 << (8 * max(0, min(8, n - 8 * k)))) - 1 for k in range(3)] for n in range(-1, 25)],
                      dtype=np.uint64)


def _ranks(data: bytes, head: np.ndarray, starts, tag: np.ndarray, close: np.ndarray):
    """(rank name, the tag text is one) per line, parsed once per distinct tag text `[tag, close)`."""
    length = np.clip(close - tag, -1, MAX_TAG)
    masks = _TAG_MASKS[length + 1]
    words = [_tag_word(head, tag, k) & masks[:, k] for k in range(3)]
    keys = np.stack(words + [length.astype(np.uint64)], axis=1)
    codes, first = _factorize(keys)
    same = np.ones(len(keys), bool)
    for column in keys.T:
        same &= column == column[first[codes]]
    tags = map(data.__getitem__, map(slice, (starts + tag)[first].tolist(), (starts + tag + length)[first].tolist()))
    names = [_rank_name(text) if n >= 0 else None for text, n in zip(tags, length[first].tolist())]
    named = np.array([name is not None for name in names], bool)
    fits = close - tag <= MAX_TAG
    return np.array([name or "" for name in names], dtype=object)[codes], named[codes] & same & fits


def _tag_word(head: np.ndarray, tag: np.ndarray, k: int) -> np.ndarray:
    """Word k of the tag text, which starts at byte 20 or 24 of the line."""
    lo, hi = head[:, 2 + k], head[:, 3 + k]
    shifted = (lo >> np.uint64(32)) | (hi << np.uint64(32))
    return np.where(tag == TAG + 4, hi, shifted) if (tag != TAG).any() else shifted


def _factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the rows of `keys` by a 64-bit hash, and the first row of each code (callers check rows
    against their code's first row: a hash collision then reads as a mismatch, never as a wrong match)."""
    mixed = np.zeros(len(keys), np.uint64)
    for k, column in enumerate(keys.T):
        mixed = (mixed ^ column) * np.uint64(0x9E3779B97F4A7C15 + 2 * k)
    codes, first = np.full(len(keys), -1, np.int64), []
    for code in range(FEW):
        rest = np.flatnonzero(codes < 0)
        if len(rest) == 0:
            return codes, np.array(first, np.int64)
        first.append(rest[0])
        codes[rest[mixed[rest] == mixed[rest[0]]]] = code
    _, first, codes = np.unique(mixed, return_index=True, return_inverse=True)
    return codes.ravel(), first


_RANK_NAMES: dict[bytes, str | None] = {}


def _rank_name(tag: bytes) -> str | None:
    """The rank of a tag text (`None` when it is not one), as `read_stamp` normalises it."""
    name = _RANK_NAMES.get(tag, "?")
    if name == "?":
        text = tag.decode("ascii")
        name = " ".join(text.split()) if _RANK.fullmatch(text) else None
        if len(_RANK_NAMES) < 4096:
            _RANK_NAMES[tag] = name
    return name


# -- per-line checks the layout cannot settle -----------------------------------------------------------

def finds(data: bytes, needle: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return np.fromiter(map(data.find, repeat(needle), starts.tolist(), ends.tolist()), np.int64, len(starts))


def _verify(data: bytes, raw: Bytes, kind: np.ndarray, starts, ends, close: np.ndarray) -> None:
    """What the layout cannot settle: a prefill line must say `running`; an access line needs ` - "` right
    after its client token and `HTTP/`; and neither may hold another batch label, which the per-line reader
    tests first. A count over the block settles the last when every `b` (a one-byte count, the cheapest
    scan), else every ` batch`, belongs to a label."""
    pre = np.flatnonzero(kind == PREFILL)
    kind[pre[finds(data, b"running", starts[pre], ends[pre]) < 0]] = -1
    _verify_access(data, raw, kind, starts, ends, close)
    labels = int(((kind == DECODE) | (kind == PREFILL)).sum())
    if data.count(b"b") > labels and data.count(b" batch") > labels:
        rows = np.flatnonzero(kind == PREFILL)
        kind[rows[finds(data, b"Decode batch", starts[rows], ends[rows]) >= 0]] = -1
        rows = np.flatnonzero(kind == ACCESS)
        kind[rows[finds(data, b" batch", starts[rows], ends[rows]) >= 0]] = -1


def _verify_access(data: bytes, raw: Bytes, kind: np.ndarray, starts, ends, close: np.ndarray) -> None:
    rows = np.flatnonzero(kind == ACCESS)
    client = starts[rows] + close[rows] + len(_ACCESS)
    space = first_byte(raw.words(client, 4), ord(" "))
    dash = client + space
    good = (space > 0) & (dash < ends[rows]) & has_literal(raw.words(dash, 1), b' - "')
    good &= finds(data, b"HTTP/", dash, ends[rows]) >= 0
    kind[rows[~good]] = -1
