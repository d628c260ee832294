"""The fields of hot access lines, `INFO:     CLIENT - "METHOD PATH HTTP/V" STATUS`, for `--export`: read as
`parse_fields` reads them (its regex), for the lines in that exact form; the rest are left to it. Numpy only: the
read's workers never start Arrow (the export makes the text fields' strings from their spans when it writes)."""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.read.fastpath.scan import AccessLines
from toolkit.diagnose.read.fastpath.words import Words, digit_run, first_byte, is_literal, parse_digits, window
from toolkit.diagnose.read.messages import ACCESS_HTTP, MAX_CLIENT_CHARS

_HTTP = ACCESS_HTTP.encode()
_WHITESPACE = (b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")
_UPPER = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)
_VERSION = np.frombuffer(b"0123456789.", np.uint8)


TEXT_FIELDS = ("client", "method", "path")  # read as spans of the chunk; `status` as a number


def access_fields(data: bytearray, words: Words, lines: AccessLines,
                  ends: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(which of `lines` were read here, their fields: each of `TEXT_FIELDS` as its [begin, end) offsets in `data`
    (int64, shape (2, lines read)), `status` as int64)."""
    client = lines.client
    n = len(client)
    if n == 0 or any(w in data for w in _WHITESPACE):
        return np.zeros(n, bool), {}
    # NOTE: a piece not found in its window counts as found at its start, and the line as not read: every offset
    # stays within the line's window (a line near the chunk's end reads no byte past its padding)
    found = np.ones(n, bool)
    dash = client + _found(words, client, ord(" "), 4, found)
    method = dash + 4
    method_end = method + _found(words, method, ord(" "), 2, found)
    path = method_end + 1
    path_end = _first_space(data, words, path, ends)
    version = path_end + len(_HTTP)
    quote = version + _found(words, version, ord('"'), 1, found)
    status_word = words.at(np.minimum(quote + 2, len(words.words) - 1))
    status = np.where(digit_run(status_word) >= 3, parse_digits(status_word, 3), -1)
    ok = found & (method_end > method) & _all_in(words, method, method_end, _UPPER)
    ok &= (path_end > path) & is_literal(words.at(np.maximum(path_end, 0)), _HTTP)
    ok &= (quote > version) & _all_in(words, version, quote, _VERSION) & (words.byte(quote + 1) == ord(" "))
    ok &= (status >= 0) & (quote + 5 <= ends) & (dash - client <= MAX_CLIENT_CHARS)
    take = np.flatnonzero(ok)
    spans = ((client, dash), (method, method_end), (path, path_end))
    fields = {name: np.stack([begin[take], end[take]]) for name, (begin, end) in zip(TEXT_FIELDS, spans)}
    return ok, {**fields, "status": status[take]}


def _first_space(data: bytearray, words: Words, begin: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The offset of the first space in each [begin, end) of `data`, -1 where there is none: the first 32 bytes
    of each at once, `find` over the rest of the few that hold none there (a long path)."""
    start = np.minimum(begin, ends)  # NOTE: a span that starts past its line's end holds nothing
    found = start + _first(words, start, ord(" "), 4)
    found = np.where(found < ends, found, -1)
    longer = np.flatnonzero((found < 0) & (start + 32 < ends))
    if len(longer):
        found[longer] = [data.find(b" ", a, b) for a, b in zip((start[longer] + 32).tolist(), ends[longer].tolist())]
    return found


def _found(words: Words, pos: np.ndarray, byte: int, count: int, found: np.ndarray) -> np.ndarray:
    """`_first`'s offsets, 0 where it found none (and `found` cleared there)."""
    at = _first(words, pos, byte, count)
    missing = at >= 8 * count
    found &= ~missing
    return np.where(missing, 0, at)


def _first(words: Words, pos: np.ndarray, byte: int, count: int) -> np.ndarray:
    """Offset from `pos` of the first `byte` within `count` words (a large offset where there is none)."""
    columns = window(words, pos, 8 * count)
    found = np.full(len(pos), 1 << 20, np.int64)
    for k in range(count - 1, -1, -1):
        at = first_byte(columns[k], byte)
        found = np.where(at < 8, 8 * k + at, found)
    return found


def _all_in(words: Words, begin: np.ndarray, stop: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Whether every byte in [begin, stop) (at most 16) is one of `allowed`."""
    rows = np.stack(window(words, begin, 16), axis=1).view(np.uint8).reshape(len(begin), 16)
    inside = np.arange(16) < (stop - begin)[:, None]
    return ((np.isin(rows, allowed) | ~inside).all(axis=1)) & (stop - begin <= 16)
