"""vLLM's stats lines (`Engine 000: Avg prompt throughput: ...`, docs/log-formats.md §9.2) read where a chunk is
scanned. vLLM prints one every few seconds per engine among many access and request lines; the per-line parser
would read each with its prefix, kind and field readers, several times the cost of the line here.

A line is read here only in its common form: vLLM's prefix at the line's start (`VLLM_PREFIX`, no other `[` than
its file's, no quote), the stats label, then only `Key: number unit` pieces (unit `tokens/s`, `reqs`, `%` or none;
a key of letters and blanks; a number of at most `MAX_DIGITS` digits before its point and one fewer after it), an
optional `.` and nothing after. For such a line `parse_fields` reads each piece's number the way `float` reads it
(a percent divided by 100), so the fields here are exactly its fields as the series keeps them (float64; a field
named like a table's own column, `line` or `time`, is not kept by either). The time is the prefix's on vLLM's
year-less clock, before the wraps the reader adds in line order (`LineParser.on_clock`); a date that is no
calendar date leaves the line slow. The rank is `rank.stats_rank` of the prefix's process.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from toolkit.diagnose.read.batch import ENGINE, EngineTag, engine_tag, pool_usage_field
from toolkit.diagnose.read.fastpath.words import occurrences
from toolkit.diagnose.read.prefix import VLLM_CLOCK_GROUPS, VLLM_PREFIX, VLLM_PREFIX_FIRST_BYTES, vllm_clock
from toolkit.diagnose.read.rank import process_rank, stats_rank
from toolkit.diagnose.read.series import META  # a field so named is not kept: the prefix says those
from toolkit.diagnose.read.values import MAX_DIGITS as FIELD_DIGITS, canonical

LABEL = b"Avg prompt throughput: "  # every stats line holds it: the lines to try are found by it
MAX_DIGITS = 15  # a count of at most 15 digits is a float exactly: `float` of the text is `float` of its int
# NOTE: at most 30 characters, as `fields.value` reads a number (a longer one stays text there)
_NUMBER = rf"\d{{1,{MAX_DIGITS}}}(?:\.\d{{1,{MAX_DIGITS - 1}}})?"
assert MAX_DIGITS + 1 + MAX_DIGITS - 1 <= FIELD_DIGITS
_UNITS = r"(?: tokens/s| reqs|%)?"
_PIECE = rf"[A-Za-z][A-Za-z ]{{0,63}}: {_NUMBER}{_UNITS}"
_PIECES = re.compile(rf"([A-Za-z][A-Za-z ]{{0,63}}): ({_NUMBER})({_UNITS})(?:, |\.?$)")
# NOTE: the prefix group numbers are `VLLM_PREFIX`'s (process 1, clock 2-7); the message follows it
_LINE = re.compile(rf"(?:{VLLM_PREFIX})(?P<message>(?:{ENGINE})?(?=Avg prompt throughput: )"
                   rf"{_PIECE}(?:, {_PIECE})*\.?)")
_PREFIX = re.compile(VLLM_PREFIX)
_OTHER_STARTS = re.compile(r"[\[\"'`]")  # before the clock (in a process name): another prefix or a quote


@dataclass(slots=True)
class StatsLines:
    """A chunk's stats lines read here, in line order: index in the chunk, offset of its message in the chunk,
    time (seconds on vLLM's year-less clock, no wraps), rank (index into `ranks`) and every field by canonical
    name (float64, NaN where a line does not print it)."""

    index: np.ndarray
    message: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    ranks: list[str]
    fields: dict[str, np.ndarray]

    @staticmethod
    def none() -> StatsLines:
        return StatsLines(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int16), [], {})


def stats_lines(data: bytearray, size: int, starts: np.ndarray, ends: np.ndarray, open_lines: np.ndarray) -> StatsLines:
    """The stats lines among `open_lines` (a mask of the chunk's lines: printable ASCII ones the scan left slow)."""
    found = _label_lines(data, size, starts, ends, open_lines)
    if len(found) == 0:
        return StatsLines.none()
    reader = _Reader()
    for i, begin, end in zip(found.tolist(), starts[found].tolist(), ends[found].tolist()):
        reader.read(i, begin, data[begin:end].decode("ascii"))
    return reader.lines()


def _label_lines(data: bytearray, size: int, starts: np.ndarray, ends: np.ndarray,
                 open_lines: np.ndarray) -> np.ndarray:
    """The open lines that hold the stats label (each once), looked for between the first and the last open line
    that starts like a vLLM prefix (`(` or its level's first letter)."""
    first = np.frombuffer(data, np.uint8)[starts[open_lines]]
    vllm = np.flatnonzero(open_lines)[np.isin(first, _FIRST_BYTES)]
    if len(vllm) == 0:
        return vllm
    where = occurrences(data, LABEL, int(starts[vllm[0]]), int(ends[vllm[-1]]))
    lines = np.searchsorted(starts, where, side="right") - 1  # NOTE: sorted, as `where` is
    lines = lines[np.flatnonzero(np.diff(lines, prepend=-1))]  # each once (np.unique would import numpy.ma)
    return lines[open_lines[lines]]


_FIRST_BYTES = np.frombuffer(VLLM_PREFIX_FIRST_BYTES, np.uint8)


class _Reader:
    """Stats lines read one by one into rows; what a chunk's lines repeat (their key sequence, their process and
    engine) is worked out once each."""

    def __init__(self) -> None:
        self.index: list[int] = []
        self.messages: list[int] = []
        self.times: list[float] = []
        self.ranks: list[str] = []
        self.rows: list[dict[str, float]] = []
        self._forms: dict[tuple[str, ...], tuple[list[str], str | None]] = {}
        self._rank_of: dict[tuple[str | None, str], str] = {}

    def read(self, i: int, begin: int, line: str) -> None:
        """Read line `i` (starting at offset `begin` of the chunk) if it is a stats line in the form read here."""
        m = _LINE.fullmatch(line)
        if m is None or _OTHER_STARTS.search(line, 0, m.start(2)) or _PREFIX.match(line).end() != m.start("message"):
            return  # NOTE: the message starts where the per-line parser's prefix (the grammar alone) ends
        clock = vllm_clock(*m.group(*VLLM_CLOCK_GROUPS))
        if clock is None:
            return
        message = m.group("message")
        tag = engine_tag(message)
        pieces = _PIECES.findall(message, tag.end if tag is not None else 0)
        names, pool = self._form(tuple(key for key, _, _ in pieces))
        row = {name: float(number) / 100 if unit == "%" else float(number)
               for name, (_, number, unit) in zip(names, pieces) if name not in META}
        if tag is not None:
            row = {"engines" if tag.aggregated else "engine": float(tag.number), **row}
        if pool is not None:
            row["token_usage"] = row[pool]
        self.index.append(i)
        self.messages.append(begin + m.start("message"))
        self.times.append(clock[0])
        self.ranks.append(self._rank(m.group(1), message, tag))
        self.rows.append(row)

    def _form(self, keys: tuple[str, ...]) -> tuple[list[str], str | None]:
        """The canonical names of a key sequence, and the one the pool's usage is read from."""
        form = self._forms.get(keys)
        if form is None:
            names = [canonical(key) for key in keys]
            form = self._forms[keys] = (names, pool_usage_field(names))
        return form

    def _rank(self, process: str | None, message: str, tag: EngineTag | None) -> str:
        key = (process, message[: tag.end] if tag is not None else "")
        rank = self._rank_of.get(key)
        if rank is None:
            rank = self._rank_of[key] = stats_rank(message, process_rank(process or ""))
        return rank

    def lines(self) -> StatsLines:
        return _columns(self.index, self.messages, self.times, self.ranks, self.rows)


def _columns(index: list[int], messages: list[int], times: list[float], rank_names: list[str],
             rows: list[dict[str, float]]) -> StatsLines:
    ranks = list(dict.fromkeys(rank_names))
    codes = {name: code for code, name in enumerate(ranks)}
    fields: dict[str, np.ndarray] = {}
    for i, row in enumerate(rows):
        for name, value in row.items():
            column = fields.get(name)
            if column is None:
                column = fields[name] = np.full(len(rows), np.nan)
            column[i] = value
    return StatsLines(np.array(index, np.int64), np.array(messages, np.int64), np.array(times, np.float64),
                      np.array([codes[name] for name in rank_names], np.int16), ranks, fields)
