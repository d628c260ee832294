"""Where a log message starts: the time, rank and process prefix before it (docs/log-formats.md §1, §9.1).

A message is recognised only where it starts, so a line that quotes one (a traceback's source line, an issue
title, a request body) is not that event. Prefixes, in the order they are tried:

- SGLang's stamp tag `[YYYY-mm-dd HH:MM:SS(.fff)( DPn)( TPn)...]` or `[HH:MM:SS TPn]`, preceded by any text
  without quotes (docker compose, Ray, kubectl, syslog); the tag closest to the message wins;
- vLLM's `(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] ` (the bracket is absent before 0.7);
- Python's default logging format `YYYY-mm-dd HH:MM:SS,mmm - name - LEVEL - ` (or without `,mmm`), or FastChat's
  `YYYY-mm-dd HH:MM:SS | LEVEL | name | ` (QAnything);
- at the start of the line only: SGLang's stamp without its `[` and vLLM's prefix without its level (a paste that
  began after them), an SGLang fork's `YYYY-mm-dd HH:MM:SS LEVEL pid [ DPn TPn file.py:N] `, `[gpu_id=N] ` /
  `[gpu=N] ` (0.2.5), `Rank N: ` and `[rank=N] ` (0.1), torch.distributed's
  `[rankN]: `, a Python warning's `file.py:N: UserWarning: `, a container runtime's
  `2025-11-11T04:06:27.123Z stdout F `, journald's `Nov 26 21:03:11 host python[1234]: ` (no year: read as
  vLLM's clock is), markdown bold `**` (a line pasted into an issue);
- a vLLM process prefix right after a container runtime's or journald's stamp (`... (APIServer pid=1) INFO:     `,
  an access line: no vLLM clock) belongs to the prefix;
- a vLLM prefix right after a stamp tag (Buildkite's `[2025-03-10T15:07:20Z] INFO 03-10 08:07:20 [core.py:302] `)
  belongs to the prefix.

With two stamps on a line (a collector's, then the engine's) the engine's, closest to the message, gives the time.

Times are seconds on the log's clock: naive timestamps read as UTC. `HH:MM:SS` (SGLang 0.2.15-0.3.0) gives
seconds within day 0 and vLLM's `MM-DD HH:MM:SS` seconds within the year 2000 (a leap year); `period` says how
long such a clock runs before it wraps, and the parser adds periods when it does. `clock_text` writes a time
back the way the log printed it (no invented date). The grammars, the stamp -> seconds rule and the rank names
are declared in `diagnose.log_format.prefix`; this module reads lines with them.
"""
from __future__ import annotations

import re
import time
from functools import lru_cache
from typing import NamedTuple

from toolkit.diagnose.log_format.prefix import (DAY, LINE_START, PID_FILE_LOGGING, PYTHON_LOGGING, SGLANG_STAMP,
                                                SGLANG_STAMP_CUT, SGLANG_STAMP_YEAR_CUT, SOURCE_LEVEL, STERN,
                                                SYSLOG_STAMP, TIME, VLLM_CLOCK_GROUPS, VLLM_DEFAULT_YEAR, VLLM_LEVELS,
                                                VLLM_PREFIX, VLLM_PROCESS,
                                                VLLM_PROCESS_BODY, VLLM_STAMP, YEAR, days_since_epoch, gpu_rank,
                                                is_date, month_number, process_rank, rank_name, time_of_day, tp_rank)

_SGLANG = re.compile(SGLANG_STAMP)
_SOURCE_LEVEL = re.compile(SOURCE_LEVEL)
_SGLANG_CUT = re.compile(SGLANG_STAMP_CUT)
_SGLANG_YEAR_CUT = re.compile(SGLANG_STAMP_YEAR_CUT)
_VLLM_CUT = re.compile(VLLM_STAMP)  # at a line's start: vLLM's prefix pasted without its level
_PID_FILE = re.compile(PID_FILE_LOGGING)
_FIRST_SGLANG = re.compile(r"[^\"'`]*?" + SGLANG_STAMP)  # the first stamp, only unquoted text before it
_STAMP_OPENS = re.compile(r"\[\d")  # how SGLANG_STAMP begins: `[`, then TIME's first digit (of a date or an hour)
_VLLM = re.compile(VLLM_PREFIX)
_VLLM_CLOCK = re.compile(VLLM_LEVELS + r" \d\d-\d\d ")  # NOTE: every vLLM prefix holds it: a quick test first
_VLLM_PROCESS = re.compile(VLLM_PROCESS)
# at the line's start, after stern's names if any; or without its `(` where a paste began right after it (vLLM's
# process names are CamelCase: `EngineCore_0 pid=N) `)
_VLLM_PROCESS_FIRST = re.compile(r"(?:" + STERN + r"?\(|(?=[A-Z]))" + VLLM_PROCESS_BODY)
_PYLOG = re.compile(PYTHON_LOGGING)
# NOTE: every Python logging prefix holds it: a quick test
_PYLOG_CLOCK = re.compile(r":\d\d(?:(?:[,.]\d{3})?(?: - | \[[A-Z]| [a-z_])| \| )")
_START = re.compile(LINE_START)
_TIME = re.compile(TIME)
_SYSLOG = re.compile(SYSLOG_STAMP)
_QUOTES = ("\"", "'", "`")


class Prefix(NamedTuple):
    """The prefix of one line: `time` (None when it prints none), `rank`, `start` of the message, `period`
    (seconds after which the clock wraps: a day for `HH:MM:SS`, a year for vLLM; None when dated), and `vllm`:
    vLLM's own logger wrote it (`LEVEL MM-DD HH:MM:SS [file.py:N] `), which names the engine of a log whose
    messages could be either's (an OOM, a traceback)."""

    time: float | None
    rank: str
    start: int
    period: float | None = None
    vllm: bool = False


NO_PREFIX = Prefix(None, "", 0, None)


@lru_cache(maxsize=512)
def _midnight(y: str | None, mo: str, d: str, default_year: int | None) -> float | None:
    """Seconds at the date's midnight (a log holds few dates: read once each), None when it is no calendar date."""
    year = int(y) if y is not None else default_year
    if year is None or not is_date(year, int(mo), int(d)):
        return None
    return days_since_epoch(year, int(mo), int(d)) * DAY


def _clock(y: str | None, mo: str | None, d: str | None, h: str, mi: str, s: str, frac: str | None,
           default_year: int | None = None) -> tuple[float, float | None] | None:
    """(seconds, period) of a date and time of day, None when the date is not a calendar date."""
    tod = time_of_day(int(h), int(mi), int(s)) + (float("0." + frac) if frac else 0.0)
    if mo is None or d is None:
        return tod, DAY
    midnight = _midnight(y, mo, d, default_year)
    if midnight is None:
        return None
    return midnight + tod, (None if y is not None else YEAR)


_YEAR_2000 = days_since_epoch(VLLM_DEFAULT_YEAR, 1, 1) * DAY
_YEAR_2010 = days_since_epoch(VLLM_DEFAULT_YEAR + 10, 1, 1) * DAY


def window_on_clock(window: tuple[float, float], sample: float | None) -> tuple[float, float]:
    """A window of dated times (naive, as UTC) moved onto the clock of a log whose latest time is `sample`: the
    same month-day-time in vLLM's year-2000 clock (`MM-DD`, journald), the same time of day on the sample's day for
    a time-only clock, unchanged for a dated log. A window that wraps the clock's period ends one period later."""
    if sample is None or not (sample < 1000 * DAY or _YEAR_2000 <= sample < _YEAR_2010):
        return window
    if sample < 1000 * DAY:
        base, period = (sample // DAY) * DAY, DAY
        start, end = (base + w % DAY for w in window)
    else:
        period = YEAR
        start, end = (_in_year_2000(w) for w in window)
    return (start, end if end >= start else end + period)


def _in_year_2000(t: float) -> float:
    stamp = time.gmtime(t)
    seconds = stamp.tm_hour * 3600 + stamp.tm_min * 60 + stamp.tm_sec + (t % 1)
    return float(days_since_epoch(VLLM_DEFAULT_YEAR, stamp.tm_mon, stamp.tm_mday)) * DAY + seconds


def clock_text(t: float | None) -> str:
    """A log-clock time as the log printed it: `HH:MM:SS` (`day N HH:MM:SS` after a wrap) for time-only clocks,
    `MM-DD HH:MM:SS` for vLLM's year-less clock, else `YYYY-mm-dd HH:MM:SS`; `?` for no time."""
    if t is None:
        return "?"
    stamp = time.gmtime(t)
    if t < 1000 * DAY:
        day = int(t // DAY)
        return time.strftime("%H:%M:%S", stamp) if day == 0 else f"day {day} " + time.strftime("%H:%M:%S", stamp)
    if _YEAR_2000 <= t < _YEAR_2010:
        return time.strftime("%m-%d %H:%M:%S", stamp)
    return time.strftime("%Y-%m-%d %H:%M:%S", stamp)


def _unquoted(text: str) -> bool:
    return not text or not any(quote in text for quote in _QUOTES)


def _closest_stamp(line: str) -> re.Match[str] | None:
    """The SGLang stamp closest to the message: the line's first stamp (only unquoted text before it) or the last of
    the stamps that directly follow it."""
    if _STAMP_OPENS.search(line) is None:  # NOTE: a quick test: every stamp opens so (most other lines have none)
        return None
    m = _FIRST_SGLANG.match(line)
    if m is None:
        return None
    while (nxt := _SGLANG.match(line, m.end())) is not None:
        m = nxt
    return m


def _sglang(line: str) -> Prefix | None:
    m = _closest_stamp(line)
    if m is None:
        return None
    clock = _clock(*m.groups()[:7])
    time, period = clock if clock is not None else (None, None)
    start = m.end()
    gpu = _START.match(line, start) if line.startswith("[gpu", start) else None
    rank = rank_name(m.group(8))
    if gpu is not None and gpu.group("gpu") is not None:
        start, rank = gpu.end(), rank or gpu_rank(gpu.group('gpu'))
    elif (source := _SOURCE_LEVEL.match(line, start)) is not None:
        start = source.end()
    return Prefix(time, rank, start, period)


def vllm_clock(month: str, day: str, hour: str, minute: str, second: str,
               fraction: str | None) -> tuple[float, float | None] | None:
    """(seconds, period) of vLLM's year-less `MM-DD HH:MM:SS(.ffffff)`, None where `MM-DD` is no calendar date."""
    return _clock(None, month, day, hour, minute, second, fraction, VLLM_DEFAULT_YEAR)


def _vllm(line: str) -> Prefix | None:
    m = _VLLM.search(line) if _VLLM_CLOCK.search(line) is not None else None
    if m is None or not _unquoted(line[: m.start()]):
        return None
    clock = vllm_clock(*m.group(*VLLM_CLOCK_GROUPS))
    time, period = clock if clock is not None else (None, None)
    return Prefix(time, process_rank(m.group(1) or ""), m.end(), period, vllm=True)


def _vllm_inside(line: str, outer: Prefix) -> Prefix:
    """A vLLM prefix right after a stamp tag (Buildkite's `[2025-03-10T15:07:20Z] INFO 03-10 08:07:20 [core.py:302] `)
    is part of the prefix: the message starts after it; the outer stamp (dated) keeps the time."""
    inner = _VLLM.match(line, outer.start)
    if inner is None:
        return outer
    return Prefix(outer.time, process_rank(inner.group(1) or "") or outer.rank, inner.end(), outer.period, vllm=True)


_GLUED = re.compile(r"\s(?=" + VLLM_PREFIX + ")")  # a vLLM prefix after a space: a record glued to the one before


def glued_records(line: str) -> list[str]:
    """The vLLM records of a line that holds several (a paste that lost its newlines: `... usage: 0.0% (APIServer
    pid=1) INFO 01-25 11:26:58 [llm_engine.py:706] Avg ...`), each from its own prefix; `[line]` for every other
    line. A record starts at a whole vLLM prefix after a space, past the prefix of the record before, with no quote
    in the text of the record before (a prompt may quote a log line). A line with an SGLang stamp is SGLang's: one
    record (`stamped_message_start` and `read_prefix` read it so)."""
    clock = _VLLM_CLOCK.search(line)
    if clock is None or _VLLM_CLOCK.search(line, clock.end()) is None:
        return [line]  # NOTE: a quick test: every vLLM prefix holds a clock, so two records hold two
    first = _VLLM.search(line)
    if first is None or _closest_stamp(line) is not None:
        return [line]
    starts, at = [0], first.end()
    while (m := _GLUED.search(line, at)) is not None and _unquoted(line[starts[-1]: m.start()]):
        starts.append(m.end())
        at = _VLLM.match(line, m.end()).end()  # type: ignore[union-attr]  # NOTE: the lookahead matched it
    if len(starts) == 1:
        return [line]
    return [line[a:b].rstrip() for a, b in zip(starts, [*starts[1:], len(line)])]


def stamped_message_start(line: str) -> int | None:
    """Where the message starts when the line's prefix is an SGLang stamp with a valid time (after any unquoted
    text) and nothing else: the commonest prefix, read without `read_prefix`'s time, rank and other prefixes; None
    for every other line. Where it answers, it is `read_prefix(line).start` with a time
    (tests/diagnose/test_log_format_differential.py checks it on every sample and real line)."""
    m = _closest_stamp(line)
    if m is None:
        return None
    start = m.end()
    if line.startswith("[gpu", start) or _VLLM.match(line, start) or _SOURCE_LEVEL.match(line, start):
        return None
    y, mo, d = m.group(1, 2, 3)
    if mo is not None and _midnight(y, mo, d, None) is None:
        return None
    return start


def read_prefix(line: str) -> Prefix:
    """The time, rank and message start of `line`; `NO_PREFIX` parts where it has none."""
    found = _sglang(line) if "[" in line else None
    if found is not None:
        return _vllm_inside(line, found)
    found = _vllm(line) if ":" in line else None
    if found is not None:
        return found
    m = _PYLOG.search(line) if _PYLOG_CLOCK.search(line) is not None else None
    if m is not None and _unquoted(line[: m.start()]):
        return _on_clock(_clock(*m.groups()), "", m.end())
    cut = _SGLANG_CUT.match(line)
    if cut is not None:  # NOTE: `2025-02-09 10:14:05 TP0] Decode batch. ...`: the paste began after the `[`
        return _on_clock(_clock(*cut.groups()[:7]), rank_name(cut.group(8)), cut.end())
    cut = _SGLANG_YEAR_CUT.match(line)
    if cut is not None:  # NOTE: `025-06-23 18:55:20 TP0] Decode batch. ...`: the paste began inside the year
        return Prefix(None, rank_name(cut.group(1)), cut.end(), None)
    cut = _VLLM_CUT.match(line)
    if cut is not None:  # NOTE: `11-21 00:12:08 llm_engine.py:624] Avg prompt ...`: the paste began after the level
        return _on_clock(vllm_clock(*cut.groups()), "", cut.end(), vllm=True)
    fork = _PID_FILE.match(line)
    if fork is not None:
        return _on_clock(_clock(*fork.groups()[:7]), rank_name(fork.group(8)), fork.end())
    process = _VLLM_PROCESS_FIRST.match(line) if "pid=" in line else None
    at = process.end() if process else 0
    m = _START.match(line, at)
    if m is None:
        return Prefix(None, process_rank(process.group(1)) if process else "", at, None)
    if m.group("gpu") is not None:
        return Prefix(None, gpu_rank(m.group('gpu')), m.end(), None)
    rank = m.group("rank") or m.group("torch") or m.group("early")
    if rank is not None:
        return Prefix(None, tp_rank(rank), m.end(), None)
    if m.group("process") is not None:
        return Prefix(None, process_rank(m.group("process")), m.end(), None)
    if m.group("tags") is not None:
        return Prefix(None, rank_name(m.group("tags")), m.end(), None)
    stamp = m.group("iso") or m.group("viewer")
    if stamp is not None:
        iso = _TIME.match(stamp.replace("T", " "))
        clock = _clock(*iso.groups()) if iso else None
        return _process_after(line, Prefix(clock[0] if clock else None, "", m.end(), None))
    if m.group("syslog") is not None:
        return _process_after(line, _syslog(m.group("syslog"), m.end()))
    return _process_after(line, Prefix(None, "", m.end(), None))


def _on_clock(clock: tuple[float, float | None] | None, rank: str, start: int, vllm: bool = False) -> Prefix:
    """A prefix at `clock` (`_clock`'s (seconds, period); None: no calendar date, so no time)."""
    time, period = clock if clock is not None else (None, None)
    return Prefix(time, rank, start, period, vllm)


def _process_after(line: str, outer: Prefix) -> Prefix:
    """A vLLM process prefix right after a collector's stamp (`2025-10-15T00:02:43Z (APIServer pid=1) INFO:     ...`,
    an access line: no vLLM clock) belongs to the prefix: the message starts after it; the stamp keeps the time."""
    process = _VLLM_PROCESS.match(line, outer.start)
    if process is None:
        return outer
    return Prefix(outer.time, process_rank(process.group(1)), process.end(), outer.period)


def _syslog(stamp: str, start: int) -> Prefix:
    """journald's `Nov 26 21:03:11` prints no year: it reads as vLLM's month-day clock does (a year 2000 time
    that wraps yearly)."""
    m = _SYSLOG.match(stamp)
    assert m is not None
    month, day, *rest = m.groups()
    clock = _clock(None, str(month_number(month)), day, *rest, VLLM_DEFAULT_YEAR)
    time, period = clock if clock is not None else (None, None)
    return Prefix(time, "", start, period)
