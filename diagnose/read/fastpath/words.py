"""A chunk's bytes read eight at a time: unaligned little-endian 64-bit words at any offset, and the SWAR tests
on them (which byte is the first of a kind, how many digits lead, what number they spell).

Chunks end in zero padding (`diagnose.read.source.PAD`), so a word may be read at any offset up to the chunk's
size plus the padding less eight; callers never read further.
"""
from __future__ import annotations

import numpy as np

ONES = np.uint64(0x0101010101010101)
HIGHS = np.uint64(0x8080808080808080)
ONE = np.uint64(1)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_NIBBLE_HIGH = np.uint64(0xF0F0F0F0F0F0F0F0)
_ZEROS = np.uint64(0x3030303030303030)
_SIXES = np.uint64(0x0606060606060606)


class Words:
    """`bytes` (uint8) and `words` (the eight bytes from each offset, as one little-endian uint64)."""

    def __init__(self, data: bytearray) -> None:
        self.bytes = np.frombuffer(data, np.uint8)
        self.words = np.ndarray((len(self.bytes) - 7,), np.dtype("<u8"), self.bytes, 0, (1,))

    def at(self, pos: np.ndarray) -> np.ndarray:
        return self.words[pos]

    def byte(self, pos: np.ndarray) -> np.ndarray:
        return self.bytes[pos]


def literal(text: bytes) -> tuple[np.uint64, np.uint64]:
    """(value, mask) of up to eight bytes, for `word & mask == value`."""
    assert len(text) <= 8
    return np.uint64(int.from_bytes(text, "little")), np.uint64((1 << (8 * len(text))) - 1)


def is_literal(word: np.ndarray, text: bytes) -> np.ndarray:
    value, mask = literal(text)
    return (word & mask) == value


def first_flag(flags: np.ndarray) -> np.ndarray:
    """Index (0-7) of the lowest byte whose high bit is set in `flags`, 8 where none is."""
    lowest = flags & (~flags + ONE)
    return (np.bitwise_count(lowest - ONE) >> 3).astype(np.int64)


def zero_flags(word: np.ndarray) -> np.ndarray:
    """High bit set in each zero byte (exact for the lowest one; a borrow may flag bytes above it)."""
    return (word - ONES) & ~word & HIGHS


def first_byte(word: np.ndarray, byte: int) -> np.ndarray:
    """Index (0-7) of the first `byte` in each word, 8 where it has none."""
    return first_flag(zero_flags(word ^ np.uint64(byte * 0x0101010101010101)))


def first_below(word: np.ndarray, bound: int) -> np.ndarray:
    """Index (0-7) of the first byte < `bound` (<= 128) in each word of ASCII bytes, 8 where none is."""
    return first_flag((word - np.uint64(bound * 0x0101010101010101)) & ~word & HIGHS)


def digit_run(word: np.ndarray) -> np.ndarray:
    """Number of leading ASCII digits (0-8) in each word."""
    other = (word & _NIBBLE_HIGH) ^ _ZEROS
    other |= ((word & np.uint64(0x0F0F0F0F0F0F0F0F)) + _SIXES) & _NIBBLE_HIGH
    return first_flag((((other & _LOW7) + _LOW7) | other) & HIGHS)


def all_digits(word: np.ndarray, digits: np.uint64) -> np.ndarray:
    """Whether every byte of `word` under the byte mask `digits` is an ASCII digit."""
    high = digits & _NIBBLE_HIGH
    threes = digits & _ZEROS
    sixes = digits & _SIXES
    return ((word & high) == threes) & ((((word & digits) + sixes) & high) == threes)


_HALF_SHIFT = np.array([4 * (8 - min(max(c, 1), 8)) for c in range(9)], np.uint64)
_ZERO_FILL = np.array([int.from_bytes(b"0" * (8 - min(max(c, 1), 8)), "little") for c in range(9)], np.uint64)


def parse_digits(word: np.ndarray, count: np.ndarray | int) -> np.ndarray:
    """The number the first `count` (1-8; 0 reads as 1) digit bytes of each word spell: the digits are moved
    to the top of the word behind '0' bytes, then combined in pairs, fours and eights."""
    if isinstance(count, int):
        count = np.full(len(word), count, np.int64)
    half = _HALF_SHIFT[count]
    x = ((word << half) << half) | _ZERO_FILL[count]
    x = x - _ZEROS
    x = (x * np.uint64(10) + (x >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x * np.uint64(100) + (x >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = (x * np.uint64(10000) + (x >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return x.astype(np.int64)


_HIGH_TENS = np.uint64(0x7676767676767676)


def digit_values(word: np.ndarray) -> np.ndarray:
    """Each byte less '0': a digit byte becomes its value (0-9), any other ASCII byte 10 or more."""
    return word ^ _ZEROS


def nondigit_flags(values: np.ndarray) -> np.ndarray:
    """High bit set in each byte of `digit_values` that is not a digit (bytes up to the first non-ASCII one)."""
    return (values + _HIGH_TENS) & HIGHS


def lowest_flag_bits(flags: np.ndarray) -> np.ndarray:
    """8 x the index (0-7) of the lowest byte flagged in `flags` (uint8; 56 where none is)."""
    return np.bitwise_count(flags ^ (flags - ONE)) - np.uint8(8)


def spell(values: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The number (uint64) the digit values in the low `bits` / 8 bytes (1-8) of each word spell: moved to the
    top of the word (zeros below), then combined in pairs, fours and eights."""
    x = values << (np.uint64(64) - bits)
    x = (x * np.uint64(10) + (x >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x * np.uint64(100) + (x >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    return (x * np.uint64(10000) + (x >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


def digit_at(word: np.ndarray, k: int) -> np.ndarray:
    """The value of the ASCII digit at byte `k` of each word."""
    return ((word >> np.uint64(8 * k)) & np.uint64(0x0F)).astype(np.int64)


def two_digits(word: np.ndarray, k: int) -> np.ndarray:
    """The two-digit number at bytes `k`, `k + 1` of each word."""
    pair = (word >> np.uint64(8 * k)) & np.uint64(0x0F0F)
    return ((pair & np.uint64(0x0F)) * np.uint64(10) + (pair >> np.uint64(8))).astype(np.int64)


def gather(words: Words, pos: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes (a multiple of 8) from each offset in `pos`, as rows of `width // 8` words: one gather
    of whole rows (a gather costs about the same for 8 bytes as for 64)."""
    view = np.ndarray((len(words.bytes) - width + 1,), np.dtype((np.void, width)), words.bytes, 0, (1,))
    return view[pos].view(np.uint64).reshape(len(pos), width // 8)


def window(words: Words, pos: np.ndarray, width: int) -> list[np.ndarray]:
    """The `width` bytes (a multiple of 8) from each offset in `pos`, as `width // 8` contiguous columns of
    words: one gather of whole rows, then every word at a fixed offset is a column."""
    view = np.ndarray((len(words.bytes) - width + 1,), np.dtype((np.void, width)), words.bytes, 0, (1,))
    rows = view[pos].view(np.dtype("<u8")).reshape(len(pos), width // 8)
    return list(np.ascontiguousarray(rows.T))


def select(columns: list[np.ndarray], q: np.ndarray) -> np.ndarray:
    """`columns[q[i]][i]` for each row i (q within range; a handful of distinct values)."""
    low, high = int(q.min()), int(q.max())
    out = columns[low]
    for k in range(low + 1, high + 1):
        out = np.where(q == k, columns[k], out)
    return out


def word_at(columns: list[np.ndarray], offset: np.ndarray) -> np.ndarray:
    """Each row's eight bytes from byte `offset` of its window (offset <= 8 * (len(columns) - 1))."""
    if len(offset) == 0:
        return np.zeros(0, np.uint64)
    q = offset >> 3
    r = ((offset & 7) << 3).astype(np.uint64)
    low = select(columns, q)
    high = select(columns + [np.zeros_like(columns[0])], q + 1)
    return (low >> r) | ((high << (np.uint64(63) - r)) << ONE)


def occurrences(data: bytes | bytearray, piece: bytes, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Offsets of the (non-overlapping) occurrences of a rare `piece` in `data[start:stop]`, found one by one:
    `find` skips the bytes between them faster than any test over every byte."""
    stop = len(data) if stop is None else stop
    at, found = data.find(piece, start, stop), []
    while at >= 0:
        found.append(at)
        at = data.find(piece, at + len(piece), stop)
    return np.array(found, np.int64)
