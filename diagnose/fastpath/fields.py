"""The `key: value` pieces of hot decode and prefill lines, read for all lines at once, one piece per step.

A line that leaves the known forms (an unknown key, a value that is not a plain number or boolean, other
separators, no `#running-req`) is reported back unread and goes to the per-line parser: every line read here
has exactly the fields `parse_fields` gives it (docs/log-formats.md §8).
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.fastpath.words import ONE, Words, digit_run, is_literal, parse_digits
from toolkit.diagnose.fields import canonical

KEYS = ("#running-req", "#running_req", "#queue-req", "#token", "#full token", "#gpu token", "token usage",
        "full token usage", "gpu token usage", "swa token usage", "#swa token", "#cpu token", "cpu token usage",
        "mamba usage", "mamba num", "cuda graph", "npu graph", "cpu graph", "musa graph",
        "gen throughput (token/s)", "input throughput (token/s)", "#new-seq", "#new-token", "#cached-token",
        "cache hit rate", "#pending-token", "accept len", "accept rate", "pre-allocated usage",
        "#retracted-req", "#prealloc-req", "#transfer-req", "#inflight-req", "#bootstrap-req",
        "#optimistic-req", "#unbootstrapped-req", "#transferring-req", "#replay-token", "cap len",
        "block accept len", "#host-receive-req", "waiting-image-req")
_LITERALS = [f"{key}: ".encode() for key in KEYS]
NAMES = [canonical(key) for key in KEYS]
BOOLEAN = frozenset({"cuda_graph"})
USAGES = ("token_usage", "swa_token_usage", "mamba_usage")  # the binding pool usage is their maximum
_PRINTS = np.array(sorted({int.from_bytes(lit[:8], "little") for lit in _LITERALS}), np.uint64)
_GROUPS = [[i for i, lit in enumerate(_LITERALS) if int.from_bytes(lit[:8], "little") == p] for p in _PRINTS.tolist()]
_LENGTHS = np.array([len(lit) for lit in _LITERALS])
_IS_BOOLEAN = np.array([name in BOOLEAN for name in NAMES])
_RUNNING = np.array([name == "running_req" for name in NAMES])
MAX_PIECES = 48
_BYTE = np.uint64(0xFF)
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_POW10F = _POW10.astype(np.float64)
_TRUE, _FALSE = b"True", b"False"


def _perfect_hash(prints: np.ndarray) -> tuple[np.uint64, np.ndarray]:
    """A multiplier that sends each first word of a key to its own bucket of 256, and the bucket table."""
    for multiplier in range(0x9E3779B97F4A7C15, 0x9E3779B97F4A7C15 + 4096 * 2, 2):
        m = np.uint64(multiplier)
        buckets = (prints * m) >> np.uint64(56)
        if len(np.unique(buckets)) == len(prints):
            table = np.full(256, len(prints), np.int64)
            table[buckets] = np.arange(len(prints))
            return m, table
    raise AssertionError("no perfect hash for the key table")


_HASH, _BUCKETS = _perfect_hash(_PRINTS)
_PRINTS_PADDED = np.concatenate([_PRINTS, [np.uint64(0)]])
_PRINT_GROUP = {p: g for g, p in enumerate(_PRINTS.tolist())}


def read_pieces(words: Words, body: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(read, {canonical name: float64 values, NaN where a line does not print it}) for the lines whose
    pieces start at `body` and end at `end`; booleans read as 1.0/0.0. Each step reads one piece of every
    line still going: its key's first word (the rest of a longer key where needed), then the sixteen bytes
    at its value."""
    n = len(body)
    read = np.zeros(n, bool)
    running = np.zeros(n, bool)
    rows = np.flatnonzero(body < end)
    pos, stop_at = body[rows], end[rows]
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(MAX_PIECES):
        if len(rows) == 0:
            break
        key = _key_ids(words, pos)
        known = np.maximum(key, 0)
        start = pos + _LENGTHS[known]
        value, length, tail = _read_value(words, start, _IS_BOOLEAN[known])
        stop = start + length
        done, more = _after(tail, stop, stop_at)
        ok = (key >= 0) & ~np.isnan(value) & (more | done)
        found.append((rows, np.where(ok, key, -1), value))
        running[rows[ok & _RUNNING[known]]] = True
        finished = ok & done
        read[rows[finished]] = True
        keep = ok & more & ~done
        if keep.all():
            pos = stop + 2
            continue
        going = np.flatnonzero(keep)
        rows, pos, stop_at = rows[going], stop[going] + 2, stop_at[going]
    named = _columns(found, n)
    usages = [named[name] for name in USAGES if name in named]
    if usages:
        named["token_usage"] = np.fmax.reduce(usages) if len(usages) > 1 else usages[0]
    return read & running, named


def _columns(found: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int) -> dict[str, np.ndarray]:
    """Each step's (rows, key, value) as one column per canonical name, steps in line order so that a later
    piece overwrites an earlier one of the same name, as in a dict."""
    named: dict[str, np.ndarray] = {}
    for rows, key, value in found:
        present = np.flatnonzero(np.bincount(key + 1, minlength=len(KEYS) + 1)[1:]).tolist()
        for k in present:
            sel = np.flatnonzero(key == k) if len(present) > 1 or (key < 0).any() else slice(None)
            column = named.get(NAMES[k])
            if column is None:
                column = named[NAMES[k]] = np.full(n, np.nan)
            column[rows[sel]] = value[sel]
    return named


def _key_ids(words: Words, pos: np.ndarray) -> np.ndarray:
    """Index into KEYS of the key each piece at `pos` starts with, -1 when none: its first word picks a
    group of keys (one group when every piece shares its first word, else by a perfect hash), the rest of each
    candidate key is compared where it is longer."""
    first = words.at(pos)
    key = np.full(len(first), -1, np.int64)
    lead = int(first[0])
    if bool((first == first[0]).all()):
        group = _PRINT_GROUP.get(lead)
        if group is not None:
            _match(words, pos, key, None, group)
        return key
    group = _BUCKETS[(first * _HASH) >> np.uint64(56)]
    group = np.where(_PRINTS_PADDED[group] == first, group, len(_PRINTS))
    counts = np.bincount(group, minlength=len(_PRINTS) + 1)[:-1]
    for g in np.flatnonzero(counts).tolist():
        _match(words, pos, key, np.flatnonzero(group == g), g)
    return key


def _match(words: Words, pos: np.ndarray, key: np.ndarray, sel: np.ndarray | None, group: int) -> None:
    """Set `key` for the rows `sel` (None: all) whose piece starts with one of the group's literals (their
    first eight bytes already matched)."""
    at = pos if sel is None else pos[sel]
    for k in _GROUPS[group]:
        text = _LITERALS[k]
        if len(text) <= 8 and len(_GROUPS[group]) == 1:
            key[slice(None) if sel is None else sel] = k
            continue
        ok = np.ones(len(at), bool)
        for w in range(8, len(text), 8):
            ok &= is_literal(words.at(at + w), text[w:w + 8])
        if sel is None:
            key[ok & (key < 0)] = k
        else:
            key[sel[ok & (key[sel] < 0)]] = k


def _read_value(words: Words, start: np.ndarray,
                boolean: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, length of its text, the bytes after it) of each value starting at `start`; NaN where the text
    is not one: for `boolean` rows True/False (1.0/0.0), else `-?d+(.d+)?%?` with fewer than 8 digits each
    side of the point."""
    word = words.at(start)
    value, length, tail, whole = _read_number(words, word, start)
    if boolean.any():
        true, false = is_literal(word, _TRUE), is_literal(word, _FALSE)
        value = np.where(boolean, np.where(true, 1.0, np.where(false, 0.0, np.nan)), value)
        length = np.where(boolean, np.where(true, 4, 5), length)
        tail = np.where(boolean, word >> np.where(true, np.uint64(32), np.uint64(40)), tail)
        whole = np.where(boolean, True, whole)
    if not whole.all():
        # NOTE: a value longer than its word leaves less than two bytes after it there: read them afresh.
        rest = np.flatnonzero(~whole)
        tail[rest] = words.at(start[rest] + length[rest])
    return value, length, tail


def _read_number(words: Words, word: np.ndarray,
                 start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(value, length, the bytes after the text, whether those hold at least two bytes). The digits either
    side of the point make one integer below 10**15, so `int / 10**places` rounds as `float(text)` does."""
    negative = (word & _BYTE) == np.uint64(ord("-"))
    signed = bool(negative.any())
    if signed:
        word = np.where(negative, words.at(start + 1), word)
    whole = digit_run(word)
    integer = parse_digits(word, whole)
    shift = (np.minimum(whole, 7) * 8).astype(np.uint64)
    last, used = word >> shift, whole
    dot = ((last & _BYTE) == np.uint64(ord("."))) & (whole < 8)
    good = (whole >= 1) & (whole < 8)
    length = whole + negative
    if dot.any():
        fraction = words.at(start + length + 1)
        places = np.where(dot, digit_run(fraction), 0)
        decimals = parse_digits(fraction, places)
        value = np.where(dot, (integer * _POW10[places] + decimals) / _POW10F[places], integer)
        length = length + np.where(dot, places + 1, 0)
        good &= ~dot | ((places >= 1) & (places < 8))
        last = np.where(dot, fraction >> (np.minimum(places, 7) * 8).astype(np.uint64), last)
        used = np.where(dot, places, used)
    else:
        value = integer.astype(np.float64)
    percent = (last & _BYTE) == np.uint64(ord("%"))
    if percent.any():
        value = np.where(percent, value / 100, value)
        length = length + percent
        last = np.where(percent, last >> np.uint64(8), last)
        used = used + percent
    if signed:
        value = np.where(negative, -value, value)
    return np.where(good, value, np.nan), length, last, used <= 6


_COMMA_SPACE = np.uint64(int.from_bytes(b", ", "little"))


def _after(tail: np.ndarray, stop: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the line ends after the value, another piece follows): `tail` holds the bytes after the value; it
    ends the line, is followed by `, ` and the next piece, or by a trailing `,`, `, ` or ` `."""
    left = end - stop
    b0 = tail & _BYTE
    comma_space = (tail & np.uint64(0xFFFF)) == _COMMA_SPACE
    done = (left == 0) | ((left == 1) & ((b0 == ord(",")) | (b0 == ord(" ")))) | ((left == 2) & comma_space)
    return done, comma_space & (left > 2)
