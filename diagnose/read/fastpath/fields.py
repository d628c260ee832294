"""The `key: value` pieces of hot decode and prefill lines, read for all lines at once, one piece per step.

Lines are walked in groups that share the keys read so far (a log prints a few forms, so a chunk holds a few
groups). Each step gathers `WINDOW` bytes at every line's next piece once; within a group the key is compared
with constants and the value read at the key's fixed length, so no step reads a line's bytes twice. A group whose
lines print different keys at a step splits (at most `MAX_GROUPS` live groups; lines past that are left unread).

A line that leaves the known forms (an unknown key, a value that is not a plain number or boolean, other
separators, no `#running-req`) is reported back unread and goes to the per-line parser: every line read here
has exactly the fields `parse_fields` gives it (docs/log-formats.md §8).
"""
from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

import numpy as np

from toolkit.diagnose.read.batch import BINDING_USAGE, KEYS, RUNNING, USAGES
from toolkit.diagnose.read.fastpath.words import (Words, digit_run, digit_values, lowest_flag_bits, nondigit_flags,
                                             parse_digits, spell)
from toolkit.diagnose.read.values import canonical

_LITERALS = [f"{key}: ".encode() for key in KEYS]
NAMES = [canonical(key) for key in KEYS]
BOOLEAN = frozenset(canonical(key) for key, kind in KEYS.items() if kind == "bool")
MAX_PIECES = 48
MAX_GROUPS = 64
WINDOW = 56  # bytes gathered at a piece: the longest key (28 with `: `) and 24 bytes of its value
_WORDS = WINDOW // 8
_BYTE = np.uint64(0xFF)
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_POW10F = _POW10.astype(np.float64)
_TRUE, _FALSE = int.from_bytes(b"True", "little"), int.from_bytes(b"False", "little")
_COMMA_SPACE = np.uint64(int.from_bytes(b", ", "little"))
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def _tail_words(literal: bytes) -> list[tuple[int, np.uint64, np.uint64]]:
    """(word, value, mask) of a literal's bytes after its first eight, for `window[word] & mask == value`."""
    out = []
    for w in range(1, (len(literal) + 7) // 8):
        part = literal[8 * w: 8 * w + 8]
        out.append((w, np.uint64(int.from_bytes(part, "little")), np.uint64((1 << (8 * len(part))) - 1)))
    return out


def _first_word(literal: bytes) -> int:
    """The literal's first eight bytes as the little-endian word a window starts with (masked if shorter)."""
    return int.from_bytes(literal[:8], "little")


_PRINTS = np.array(sorted({_first_word(lit) for lit in _LITERALS if len(lit) >= 8}), np.uint64)
_SHORT = [k for k, lit in enumerate(_LITERALS) if len(lit) < 8]
assert not _SHORT, "every literal fills a first word"
_GROUPS = [[k for k, lit in enumerate(_LITERALS) if _first_word(lit) == p] for p in _PRINTS.tolist()]
_PRINT_GROUP = {p: g for g, p in enumerate(_PRINTS.tolist())}
_TAILS = [_tail_words(lit) for lit in _LITERALS]
_RUNNING = frozenset(k for k, name in enumerate(NAMES) if name == canonical(RUNNING))


def _perfect_hash(prints: np.ndarray) -> tuple[np.uint64, np.ndarray]:
    """A multiplier that sends each first word of a key to its own bucket of 256, and the bucket table."""
    for multiplier in range(0x9E3779B97F4A7C15, 0x9E3779B97F4A7C15 + 4096 * 2, 2):
        m = np.uint64(multiplier)
        buckets = (prints * m) >> np.uint64(56)
        if len(set(buckets.tolist())) == len(prints):
            table = np.full(256, len(prints), np.int64)
            table[buckets] = np.arange(len(prints))
            return m, table
    raise AssertionError("no perfect hash for the key table")


_HASH, _BUCKETS = _perfect_hash(_PRINTS)
_PRINTS_PADDED = np.concatenate([_PRINTS, [np.uint64(0)]])


class _Walk:
    """What the walk has read: per line, whether it ended well and printed `#running-req`; per step and group,
    (lines, key, values) in step order (a later piece overwrites an earlier one of the same name, as in a
    dict)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.read = np.zeros(n, bool)
        self.running = np.zeros(n, bool)
        self.found: list[tuple[np.ndarray, int, np.ndarray]] = []

    def record(self, rows: np.ndarray, key: int, values: np.ndarray) -> None:
        self.found.append((rows, key, values))
        if key in _RUNNING:
            self.running[rows] = True

    def columns(self) -> dict[str, np.ndarray]:
        named: dict[str, np.ndarray] = {}
        for rows, key, values in self.found:
            column = named.get(NAMES[key])
            if column is None:
                column = named[NAMES[key]] = np.full(self.n, np.nan)
            column[rows] = values
        usages = [named[name] for name in USAGES if name in named]
        if usages:
            named[BINDING_USAGE] = np.fmax.reduce(usages) if len(usages) > 1 else usages[0]
        return named


Group = tuple[np.ndarray, np.ndarray, np.ndarray]  # (lines, where each one's next piece starts, its end)


def read_pieces(words: Words, body: np.ndarray, end: np.ndarray,
                splits: tuple[int, ...] = ()) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(read, {canonical name: float64 values, NaN where a line does not print it}) for the lines whose
    pieces start at `body` and end at `end`; booleans read as 1.0/0.0. `splits` cut the lines into the first
    groups (lines of one kind, which print the same first key)."""
    walk = _Walk(len(body))
    groups: list[Group] = []
    for a, b in pairwise([0, *splits, len(body)]):
        if (body[a:b] < end[a:b]).all():
            going = np.arange(a, b)
        else:
            going = a + np.flatnonzero(body[a:b] < end[a:b])
        if len(going):
            groups.append((going, body[going], end[going]))
    windows = np.ndarray((len(words.bytes) - WINDOW + 1,), np.dtype((np.void, WINDOW)), words.bytes, 0, (1,))
    for _ in range(MAX_PIECES):
        if not groups:
            break
        step: list[Group] = []
        for rows, pos, stop_at in groups:
            window = windows[pos].view(np.uint64).reshape(len(pos), _WORDS)
            for key, sel in _keys(window):
                part = (rows, pos, stop_at, window) if sel is None else (rows[sel], pos[sel], stop_at[sel], window[sel])
                step += _read_values(walk, key, *part)
        if len(step) > MAX_GROUPS:
            step.sort(key=lambda group: -len(group[0]))
            step = step[:MAX_GROUPS]
        groups = step
    return walk.read & walk.running, walk.columns()


def _keys(window: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """(key, the rows that print it there, None: all) for each key the pieces at these windows start with;
    rows with no known key are left out."""
    first = window[:, 0]
    lead = int(first[0])
    if bool((first == first[0]).all()):
        group = _PRINT_GROUP.get(lead)
        return [] if group is None else _match(window, group)
    group = _BUCKETS[(first * _HASH) >> np.uint64(56)]
    group = np.where(_PRINTS_PADDED[group] == first, group, len(_PRINTS))
    out = []
    for g in np.flatnonzero(np.bincount(group, minlength=len(_PRINTS) + 1)[:-1]).tolist():
        sel = np.flatnonzero(group == g)
        out += [(key, sel if rows is None else sel[rows]) for key, rows in _match(window[sel], g)]
    return out


def _match(window: np.ndarray, group: int) -> list[tuple[int, np.ndarray | None]]:
    """The keys of one first-word group that the windows hold in full (no literal is a prefix of another, so
    each row matches at most one)."""
    out = []
    for key in _GROUPS[group]:
        tails = _TAILS[key]
        if not tails:
            return [(key, None)]
        ok = (window[:, tails[0][0]] & tails[0][2]) == tails[0][1]
        for w, value, mask in tails[1:]:
            ok &= (window[:, w] & mask) == value
        if ok.all():
            return [(key, None)]
        rows = np.flatnonzero(ok)
        if len(rows):
            out.append((key, rows))
    return out


class _Values(NamedTuple):
    """A step's values: `stop` (where each ends), `more` (another piece follows), `ok` (the rows whose value
    and what follows it read; None: all)."""

    value: np.ndarray
    stop: np.ndarray
    more: np.ndarray
    ok: np.ndarray | None


def _read_values(walk: _Walk, key: int, rows: np.ndarray, pos: np.ndarray, stop_at: np.ndarray,
                 window: np.ndarray) -> list[Group]:
    """Read the value of `key` (every row prints it at `pos`); record it and return the rows that go on."""
    length = len(_LITERALS[key])
    v0 = _word(window, length)
    boolean = NAMES[key] in BOOLEAN
    got = None if boolean else _integers(v0, pos + length, stop_at)
    value, stop, more, ok = got or _values(v0, window, length, boolean, pos + length, stop_at)
    walk.record(rows if ok is None else rows[ok], key, value if ok is None else value[ok])
    if more.all():
        return [(rows, stop + 2, stop_at)]
    walk.read[rows[~more if ok is None else ok & ~more]] = True
    keep = np.flatnonzero(more)
    return [(rows[keep], stop[keep] + 2, stop_at[keep])] if len(keep) else []


def _integers(v0: np.ndarray, start: np.ndarray, end: np.ndarray) -> _Values | None:
    """The common step: every row holds 1-6 digits followed by `, ` and another piece, or by the end of its
    line (perhaps after a trailing `,`, `, ` or ` `); None when some row does not."""
    values = digit_values(v0)
    bits = lowest_flag_bits(nondigit_flags(values))
    if not (bits - np.uint8(8) <= np.uint8(40)).all():
        return None
    stop = start + (bits >> np.uint8(3))
    tail = v0 >> bits
    left = end - stop
    comma_space = (tail & np.uint64(0xFFFF)) == _COMMA_SPACE
    more = comma_space & (left > 2)
    if not more.all() and not (more | _done(tail, left, comma_space)).all():
        return None
    return _Values(spell(values, bits).astype(np.float64), stop, more, None)


def _values(v0: np.ndarray, window: np.ndarray, length: int, boolean: bool, start: np.ndarray,
            end: np.ndarray) -> _Values:
    """Any step: booleans True/False, or numbers (`_short_number` where the rows allow, else `_number`)."""
    if boolean:
        true, false = (v0 & np.uint64(0xFFFFFFFF)) == _TRUE, (v0 & np.uint64(0xFFFFFFFFFF)) == _FALSE
        ok = true | false
        value, size = true.astype(np.float64), np.where(true, 4, 5)
        tail = np.where(true, v0 >> np.uint64(32), v0 >> np.uint64(40))
    else:
        got = _short_number(v0, window, length)
        if got is None:
            got = _number(v0, _word(window, length + 8), _word(window, length + 16))
        value, size, tail, ok = got
    stop = start + size
    left = end - stop
    comma_space = (tail & np.uint64(0xFFFF)) == _COMMA_SPACE
    more = comma_space & (left > 2)
    if (ok & more).all():
        return _Values(value, stop, more, None)
    ok &= more | _done(tail, left, comma_space)
    return _Values(value, stop, ok & more, None if ok.all() else ok)


def _short_number(v0: np.ndarray, window: np.ndarray,
                  length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """`_number` for the common steps: every row holds an integer of 1-6 digits, or every row a decimal of at
    most 8 digits, 1-7 before the point and 1-6 after (all with `%` or none), with at least two bytes after it
    in the window's 16 bytes; None when the rows are not all of one such form."""
    values = digit_values(v0)
    other = nondigit_flags(values)
    bits = lowest_flag_bits(other)
    ok = (other != 0) & (bits - np.uint8(8) <= np.uint8(48))
    after = v0 >> bits
    dot = (after & _BYTE) == np.uint64(ord("."))
    if not dot.all():
        if dot.any() or not (bits <= np.uint8(48)).all():
            return None
        return spell(values, bits).astype(np.float64), bits >> np.uint8(3), after, ok
    shift = bits + np.uint8(8)
    fraction = (v0 >> shift) | (_word(window, length + 8) << (np.uint64(64) - shift))
    decimals = digit_values(fraction)
    other = nondigit_flags(decimals)
    places = lowest_flag_bits(other)
    ok &= (other != 0) & (places - np.uint8(8) <= np.uint8(40))
    if not (bits + places <= np.uint8(64)).all():
        return None
    tail = fraction >> places
    percent = (tail & _BYTE) == np.uint64(ord("%"))
    if percent.any() and not (percent.all() and (places <= np.uint8(40)).all()):
        return None
    # NOTE: the digits either side of the point as one number (at most 8 digits), then one division.
    digits = (values & (_ALL >> (np.uint64(64) - bits))) | (decimals << bits)
    number = spell(digits, bits + places).astype(np.float64)
    size = (bits + places + np.uint8(8)) >> np.uint8(3)
    if (places == places[0]).all():
        value = number / _POW10F[places[0] >> 3]
    else:
        value = number / _POW10F[places >> np.uint8(3)]
    if percent.any():
        return value / 100, size + np.uint8(1), tail >> np.uint64(8), ok
    return value, size, tail, ok


def _word(window: np.ndarray, offset: int) -> np.ndarray:
    """The eight bytes at byte `offset` (< WINDOW - 8) of each window."""
    q, r = divmod(offset, 8)
    if r == 0:
        return window[:, q]
    return (window[:, q] >> np.uint64(8 * r)) | (window[:, q + 1] << np.uint64(64 - 8 * r))


def _bytes_at(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The eight bytes at `offset` (0-16, per row) of the 24 bytes v0 v1 v2."""
    low = offset < 8
    shift = ((offset & 7) * 8).astype(np.uint64)
    if low.all():
        return (v0 >> shift) | (v1 << (np.uint64(64) - shift))
    a = np.where(low, v0, np.where(offset == 16, v2, v1))
    b = np.where(low, v1, np.where(offset == 16, np.uint64(0), v2))
    return (a >> shift) | (b << (np.uint64(64) - shift))


def _number(v0: np.ndarray, v1: np.ndarray,
            v2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(value, length of its text, the bytes after it, whether it is one) of the numbers `-?d+(.d+)?%?` with
    fewer than 8 digits each side of the point that start each v0 v1 v2. The digits either side of the point
    make one integer below 10**15, so `int / 10**places` rounds as `float(text)` does."""
    negative = (v0 & _BYTE) == np.uint64(ord("-"))
    signed = bool(negative.any())
    if signed:
        v0 = np.where(negative, (v0 >> np.uint64(8)) | (v1 << np.uint64(56)), v0)
        v1 = np.where(negative, (v1 >> np.uint64(8)) | (v2 << np.uint64(56)), v1)
        v2 = np.where(negative, v2 >> np.uint64(8), v2)
    whole = digit_run(v0)
    integer = parse_digits(v0, whole)
    ok = (whole >= 1) & (whole < 8)
    dot = ((v0 >> (whole * 8).astype(np.uint64)) & _BYTE) == np.uint64(ord("."))
    if dot.any():
        shift = ((whole + 1) * 8).astype(np.uint64)
        fraction = (v0 >> shift) | (v1 << (np.uint64(64) - shift))
        places = np.where(dot, digit_run(fraction), 0)
        decimals = parse_digits(fraction, places)
        value = np.where(dot, (integer * _POW10[places] + decimals) / _POW10F[places], integer)
        size = whole + np.where(dot, places + 1, 0)
        ok &= ~dot | ((places >= 1) & (places < 8))
    else:
        value, size = integer.astype(np.float64), whole
    tail = _bytes_at(v0, v1, v2, size)
    percent = (tail & _BYTE) == np.uint64(ord("%"))
    if percent.any():
        value = np.where(percent, value / 100, value)
        size = size + percent
        tail = np.where(percent, tail >> np.uint64(8), tail)
    if signed:
        value = np.where(negative, -value, value)
        size = size + negative
    return value, size, tail, ok


def _done(tail: np.ndarray, left: np.ndarray, comma_space: np.ndarray) -> np.ndarray:
    """Whether the line ends after the value (`left` bytes after it, `tail` holding them): at once, or after a
    trailing `,`, `, ` or ` `."""
    b0 = tail & _BYTE
    return (left == 0) | ((left == 1) & ((b0 == ord(",")) | (b0 == ord(" ")))) | ((left == 2) & comma_space)
