"""Vectorized field reading for the scanner's hot lines, one block at a time.

The `key: value` pieces of decode and prefill lines are walked left to right, one step for all lines at once;
access lines are cut at their fixed marks. A line that leaves the known forms (an unknown key, a value that
is not a plain number or boolean, other separators) is not read here but reported back, and the caller reads
it with `parse_fields`: every line's fields equal what `parse_fields` gives.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from toolkit.diagnose.fields import canonical
from toolkit.diagnose.scan import ACCESS, KINDS, PREFILL, Bytes, FastLines, finds, first_byte, has_literal

if TYPE_CHECKING:
    import pandas as pd

_KEYS = ("#running-req", "#running_req", "#queue-req", "#token", "#full token", "#gpu token", "token usage",
         "full token usage", "gpu token usage", "swa token usage", "#swa token", "mamba usage", "mamba num",
         "cuda graph", "npu graph", "cpu graph", "musa graph", "gen throughput (token/s)",
         "input throughput (token/s)", "#new-seq", "#new-token", "#cached-token", "cache hit rate",
         "#pending-token", "accept len", "accept rate", "pre-allocated usage", "#retracted-req", "#prealloc-req",
         "#transfer-req", "#inflight-req", "#bootstrap-req", "#optimistic-req", "#unbootstrapped-req",
         "#transferring-req", "#replay-token", "cap len", "#host-receive-req")
_LITERALS = [f"{key}: ".encode() for key in _KEYS]
_NAMES = [canonical(key) for key in _KEYS]
_BOOLEAN = {"cuda_graph"}
_PRINTS = np.array(sorted({int.from_bytes(lit[:8], "little") for lit in _LITERALS}), np.uint64)
_GROUPS = [[i for i, lit in enumerate(_LITERALS) if int.from_bytes(lit[:8], "little") == fp] for fp in _PRINTS.tolist()]
_LENGTHS = np.array([len(lit) for lit in _LITERALS])
_IS_BOOLEAN = np.array([name in _BOOLEAN for name in _NAMES])
_USAGES = ("token_usage", "swa_token_usage", "mamba_usage")
MAX_PIECES = 32
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_TRUE, _FALSE = b"True", b"False"


BatchFields = tuple[np.ndarray, dict[str, np.ndarray]]


def batch_fields(fast: FastLines) -> BatchFields:
    """(indices into `fast` of the decode and prefill lines read here, their fields by canonical name)."""
    rows = np.flatnonzero(fast.kind != ACCESS)
    read, columns = read_batches(fast.raw, fast.body[rows], fast.end[rows], fast.kind[rows] == PREFILL)
    return rows[read], {name: values[read] for name, values in columns.items()}


def hot_frame(fast: FastLines, first_line: int, source: int,
              fields: BatchFields | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """The decode and prefill lines of a scanned block that read completely here (kind, line, time, rank,
    source and their fields as columns: numbers as float, `cuda_graph` as bool), and their indices in `fast`.
    `fields` is `batch_fields(fast)` when the caller has read them already."""
    import pandas as pd

    rows, columns = fields if fields is not None else batch_fields(fast)
    frame = pd.DataFrame({"kind": KINDS[fast.kind[rows]], "line": fast.index[rows] + first_line,
                          "time": fast.time[rows], "rank": fast.rank[rows], "source": source, **columns})
    return frame, rows


def read_batches(raw: Bytes, body: np.ndarray, end: np.ndarray, check_space: np.ndarray):
    """(read, {name: values}) for batch lines whose pieces start at `body`; `check_space` rows still need the
    space after their label's `.`/`,` checked."""
    columns: dict[str, np.ndarray] = {}
    pos = body.copy()
    failed = check_space & (_bytes_at(raw, body - 1) != ord(" "))
    active = ~failed & (pos < end)
    for _ in range(MAX_PIECES):
        rows = np.flatnonzero(active)
        if len(rows) == 0:
            break
        key = _key_ids(raw, pos[rows])
        start = pos[rows] + _LENGTHS[np.maximum(key, 0)]
        value, stop = _read_value(raw, start, _IS_BOOLEAN[np.maximum(key, 0)])
        done, after = _after(raw, stop, end[rows])
        ok = (key >= 0) & ~np.isnan(value) & ((after >= 0) | done)
        for k in np.flatnonzero(np.bincount(key[ok], minlength=len(_LITERALS))).tolist():
            sel = ok & (key == k)
            _column(columns, _NAMES[k], len(body))[rows[sel]] = value[sel]
        failed[rows[~ok]] = True
        pos[rows] = np.maximum(after, 0)
        active[rows] = ok & ~done
    failed |= active
    _fold_usages(columns)
    return ~failed, {name: _typed(name, values) for name, values in columns.items()}


def _bytes_at(raw: Bytes, pos: np.ndarray) -> np.ndarray:
    return raw.data[np.minimum(pos, len(raw.data) - 1)]


def _key_ids(raw: Bytes, pos: np.ndarray) -> np.ndarray:
    """Index into _LITERALS of the key each piece at `pos` starts with, -1 when none."""
    first = raw.words(pos, 1)[:, 0]
    key = np.full(len(pos), -1, np.int64)
    at = np.minimum(np.searchsorted(_PRINTS, first), len(_PRINTS) - 1)
    hit = _PRINTS[at] == first
    for group in np.flatnonzero(np.bincount(at[hit], minlength=len(_PRINTS))).tolist():
        sel = np.flatnonzero(hit & (at == group))
        for k in _GROUPS[group]:
            key[sel[_literal_at(raw, pos[sel], _LITERALS[k])]] = k
    return key


def _literal_at(raw: Bytes, pos: np.ndarray, literal: bytes) -> np.ndarray:
    """Whether `literal` starts at each offset (its first eight bytes already matched)."""
    ok = np.ones(len(pos), bool)
    for k in range(8, len(literal), 8):
        ok &= has_literal(raw.words(pos + k, 1), literal[k:k + 8])
    return ok


def _read_value(raw: Bytes, start: np.ndarray, boolean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, offset after it) of each value starting at `start`; NaN where the text is not one: for
    `boolean` rows True/False (1.0/0.0), else `-?d+(.d+)?%?` with fewer than 8 digits each side of the point."""
    number, stop = _read_number(raw, start)
    if not boolean.any():
        return number, stop
    words = raw.words(start, 1)
    true, false = has_literal(words, _TRUE), has_literal(words, _FALSE)
    flag = np.where(true, 1.0, np.where(false, 0.0, np.nan))
    return np.where(boolean, flag, number), np.where(boolean, start + np.where(true, 4, 5), stop)


def _read_number(raw: Bytes, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    negative = _bytes_at(raw, start) == ord("-")
    at = start + negative if negative.any() else start
    whole = raw.words(at, 1)[:, 0]
    digits = _digit_run(whole)
    value = _parse8(whole, digits).astype(np.float64)
    stop = at + digits
    good = (digits >= 1) & (digits < 8)
    dot = np.flatnonzero(_bytes_at(raw, stop) == ord("."))
    if len(dot):
        fraction = raw.words(stop[dot] + 1, 1)[:, 0]
        places = _digit_run(fraction)
        scale = _POW10[places]
        value[dot] = (_parse8(whole[dot], digits[dot]) * scale + _parse8(fraction, places)) / scale.astype(np.float64)
        stop[dot] += places + 1
        good[dot] &= (places >= 1) & (places < 8)
    percent = _bytes_at(raw, stop) == ord("%")
    if negative.any():
        value = np.where(negative, -value, value)
    if percent.any():
        value = np.where(percent, value / 100, value)
    return np.where(good, value, np.nan), stop + percent


_LOW7, _HIGH1 = np.uint64(0x7F7F7F7F7F7F7F7F), np.uint64(0x8080808080808080)


def _digit_run(word: np.ndarray) -> np.ndarray:
    """Number of leading ASCII digits (0..8) in each little-endian word."""
    other = (word & np.uint64(0xF0F0F0F0F0F0F0F0)) ^ np.uint64(0x3030303030303030)
    other |= ((word & np.uint64(0x0F0F0F0F0F0F0F0F)) + np.uint64(0x0606060606060606)) & np.uint64(0xF0F0F0F0F0F0F0F0)
    flags = (((other & _LOW7) + _LOW7) | other) & _HIGH1
    lowest = flags & (~flags + np.uint64(1))
    found = np.log2(np.maximum(lowest, np.uint64(1)).astype(np.float64)).astype(np.int64) // 8
    return np.where(flags == 0, 8, found)


def _parse8(word: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The number the first `count` (1..8) digit bytes of each word spell (0 where count is 0 or 8+)."""
    count = np.clip(count, 1, 8).astype(np.uint64)
    shift = (np.uint64(8) - count) * np.uint64(8)
    zeros = np.uint64(0x3030303030303030) >> (np.uint64(64) - shift) % np.uint64(64)
    x = np.where(shift == 0, word, (word << (shift % np.uint64(64))) | zeros)
    x = x - np.uint64(0x3030303030303030)
    x = (x * np.uint64(10) + (x >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x * np.uint64(100) + (x >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = (x * np.uint64(10000) + (x >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return x.astype(np.int64)


def _after(raw: Bytes, stop: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(line ends after the value, offset of the next piece or -1): a value ends the line, is followed by
    `, ` and the next piece, or by a trailing `,`, `, ` or ` `."""
    b0, b1 = _bytes_at(raw, stop), _bytes_at(raw, stop + 1)
    comma, space = b0 == ord(","), b0 == ord(" ")
    done = (stop == end) | ((comma | space) & (stop + 1 == end)) | (comma & (b1 == ord(" ")) & (stop + 2 == end))
    more = comma & (b1 == ord(" ")) & (stop + 2 < end)
    return done & (stop <= end), np.where(more & ~done, stop + 2, -1)


def _column(columns: dict[str, np.ndarray], name: str, n: int) -> np.ndarray:
    if name not in columns:
        columns[name] = np.full(n, np.nan)
    return columns[name]


def _fold_usages(columns: dict[str, np.ndarray]) -> None:
    """`token_usage` is the largest pool usage a line prints, as `parse_fields` takes it."""
    usages = [columns[name] for name in _USAGES if name in columns]
    if usages:
        columns["token_usage"] = np.fmax.reduce(usages)


def _typed(name: str, values: np.ndarray) -> np.ndarray:
    if name not in _BOOLEAN:
        return values
    out = np.full(len(values), np.nan, dtype=object)
    known = ~np.isnan(values)
    out[known] = values[known] == 1.0
    return out


# -- access lines ---------------------------------------------------------------------------------------

_WHITESPACE = (b"\t", b"\x0b", b"\x0c")
_HTTP = b" HTTP/"


def access_fields(data: bytes, fast: FastLines) -> tuple[np.ndarray, dict[str, object]]:
    """(indices into `fast` of the access lines read here, {client, method, path: Arrow strings, status}).

    The line is `... INFO:     CLIENT - "METHOD PATH HTTP/V" STATUS ...`, read as `parse_fields` reads it:
    lines with other whitespace than spaces, or another form, are left to it."""
    rows = np.flatnonzero(fast.kind == ACCESS)
    raw, end = fast.raw, fast.end[rows]
    client = fast.body[rows]
    dash = client + _first_of(raw, client, ord(" "), 4)
    method = dash + 4
    method_end = method + _first_of(raw, method, ord(" "), 2)
    path = method_end + 1
    path_end = finds(data, b" ", path, end)
    version = path_end + len(_HTTP)
    quote = version + _first_of(raw, version, ord('"'), 1)
    status = _read_status(raw, quote + 2)
    ok = (method_end > method) & _all_in(raw, method, method_end, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    ok &= (path_end > path) & has_literal(raw.words(path_end, 1), _HTTP)
    ok &= (quote > version) & _all_in(raw, version, quote, b"0123456789.") & (_bytes_at(raw, quote + 1) == ord(" "))
    ok &= (status >= 0) & (quote + 5 <= end) & (dash - client <= 100)
    if any(w in data for w in _WHITESPACE):
        ok[:] = False
    take = np.flatnonzero(ok)
    return rows[take], {"client": _strings(raw, client[take], dash[take]),
                        "method": _strings(raw, method[take], method_end[take]),
                        "path": _strings(raw, path[take], path_end[take]), "status": status[take]}


def _first_of(raw: Bytes, pos: np.ndarray, byte: int, words: int) -> np.ndarray:
    """Offset from `pos` of the first `byte` within `words` words (-1 -> a large offset: no match)."""
    found = first_byte(raw.words(pos, words), byte)
    return np.where(found >= 0, found, 1 << 20)


def _all_in(raw: Bytes, begin: np.ndarray, stop: np.ndarray, allowed: bytes) -> np.ndarray:
    """Whether every byte in [begin, stop) (at most 16) is one of `allowed`."""
    chunk = raw.words(begin, 2).view(np.uint8).reshape(len(begin), 16)
    inside = np.arange(16) < (stop - begin)[:, None]
    good = np.isin(chunk, np.frombuffer(allowed, np.uint8))
    return ((good | ~inside).all(axis=1)) & (stop - begin <= 16)


def _read_status(raw: Bytes, pos: np.ndarray) -> np.ndarray:
    """The three-digit number at each offset, -1 where there is none."""
    word = raw.words(pos, 1)[:, 0]
    three = _digit_run(word) >= 3
    return np.where(three, _parse8(word, np.full(len(pos), 3)), -1)


def _strings(raw: Bytes, begin: np.ndarray, stop: np.ndarray):
    """The ASCII text of each [begin, stop) as an Arrow string array, built without a Python object per row."""
    import pyarrow as pa

    lengths = stop - begin
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    index = np.repeat(begin - offsets[:-1], lengths) + np.arange(offsets[-1])
    chars = raw.data[index]
    return pa.StringArray.from_buffers(len(begin), pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))
