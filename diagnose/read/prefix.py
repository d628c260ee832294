"""The prefix before a message (docs/log-formats.md §1, §9.1): its grammars, the stamp -> seconds rule, rank tags
and their names, and where a message starts.

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

Times are seconds on the log's clock: naive timestamps read as UTC (proleptic Gregorian, as `calendar.timegm`).
`HH:MM:SS` (SGLang 0.2.15-0.3.0) gives seconds within day 0 and vLLM's `MM-DD HH:MM:SS` seconds within the year
2000 (a leap year); `period` says how long such a clock runs before it wraps, and the parser adds periods when it
does. `clock_text` writes a time back the way the log printed it (no invented date). The stamp arithmetic is
written with operators only, so the per-line parser calls it on ints and the fast path on numpy arrays: one rule,
two readers.
"""
from __future__ import annotations

import re
import time
from functools import lru_cache
from typing import NamedTuple, TypeVar

DAY = 86400.0
YEAR = 366 * DAY  # vLLM's `MM-DD` clock reads as the year 2000, a leap year

# -- stamp grammars (regex sources; `diagnose.read.prefix` compiles them) ------------------------------------------

TIME = r"(?:(\d{4})-(\d\d)-(\d\d)[ T])?(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?Z?"
RANK_TAGS = r"(?:\s+[A-Z][A-Z_]*\d+)*"  # ` DP1 TP2 EP3`: the tags inside SGLang's stamp
SGLANG_STAMP_CUT = TIME + r"(" + RANK_TAGS + r")\s*\] ?"  # at a line's start: a stamp pasted without its `[`
SGLANG_STAMP = r"\[" + SGLANG_STAMP_CUT
# at a line's start: a stamp pasted from inside its year (`025-06-23 18:55:20 TP0] `): its date is lost (no time)
SGLANG_STAMP_YEAR_CUT = r"\d{0,3}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?(" + RANK_TAGS + r")\s*\] ?"
# NOTE: the dated SGLang stamp's fixed layout, digits as `0`, for byte-wise readers: `TIME` with a date.
SGLANG_STAMP_LAYOUT = b"[0000-00-00 00:00:00"
VLLM_PROCESS_BODY = r"([^()\s]{1,64}(?: [^()\s]{1,32})?) pid=\d+(?:, ip=[^()\s]{1,64})?\)\s+"  # after its `(`
VLLM_PROCESS = r"\(" + VLLM_PROCESS_BODY
VLLM_LEVELS = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
VLLM_STAMP = r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))? \[?[\w./-]{1,200}:\d+\] ?"  # after the level
VLLM_PREFIX = r"(?:" + VLLM_PROCESS + r")?" + VLLM_LEVELS + r" " + VLLM_STAMP
# the bytes a line with `VLLM_PREFIX` can start with: its process's `(`, or its level's first letter
VLLM_PREFIX_FIRST_BYTES = bytes(sorted({ord("(")} | {ord(level[0]) for level in re.findall(r"[A-Z]+", VLLM_LEVELS)}))
VLLM_CLOCK_GROUPS = (2, 3, 4, 5, 6, 7)  # VLLM_PREFIX's month, day, hour, minute, second, fraction (after its process)
VLLM_MONTH_DAY = VLLM_CLOCK_GROUPS[:2]
# NOTE: the first `[` that opens a whole SGLang stamp, only unquoted text before it (what `prefix._FIRST_SGLANG`
# matches, the lazy form), written so that a regex engine skips the text before it without trying a stamp at
# every character; its year, month and day groups
_BEFORE_STAMP = r"[^\"'`\[]*(?:\[(?!" + SGLANG_STAMP_CUT + r")[^\"'`\[]*)*"
FIRST_STAMP = "(?>" + _BEFORE_STAMP + ")(?>" + SGLANG_STAMP + ")"
FIRST_STAMP_DATE = tuple(re.compile(_BEFORE_STAMP).groups + g for g in (1, 2, 3))
# what can follow the first stamp when it is the whole prefix (`stamped_message_start`): no stamp, GPU tag or vLLM
# prefix right after it
# a logging config's source and level right after SGLang's stamp: `[2026-04-15 17:13:10][scheduler_metrics_mixin.py:424]
# [INFO]: Prefill batch, ...` (sglang#22877)
SOURCE_LEVEL = r"\[[\w./-]{1,200}:\d{1,7}\]\[" + VLLM_LEVELS + r"\]: ?"
PREFIXES_AFTER_STAMP = (SGLANG_STAMP, r"\[gpu", VLLM_PREFIX, SOURCE_LEVEL)
NOTHING_MORE = "".join(f"(?!{prefix})" for prefix in PREFIXES_AFTER_STAMP)
# an SGLang fork's logger (antgroup/sglang): `2025-10-29 02:27:35 INFO 8900 [ DP15 TP15 EP15 file.py:222] `
PID_FILE_LOGGING = (r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))? " + VLLM_LEVELS
                    + r" \d{1,10} \[ ?((?:[A-Z][A-Z_]*\d+ )*)[\w./-]{1,200}:\d+\] ")
# `%(asctime)s - %(name)s - %(levelname)s - ` or `%(asctime)s [%(levelname)s] %(name)s: ` (sglang-omni#712; with or
# without `,mmm`: a `datefmt` drops it), or FastChat's; or `%(asctime)s.%(msecs)03d %(name)s ` before uvicorn's level
# prefix (KServe's access log: `2025-05-14 17:45:10.901 uvicorn.access INFO:     CLIENT PID - "..."`, kserve#4470)
PYTHON_LOGGING = (r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:(?:[,.](\d{3}))?"
                  r"(?: - [\w.]{1,100} - [A-Z]{1,10} - | \[[A-Z]{1,10}\] [\w.]{1,100}: "
                  r"| [a-z_][\w.]{0,99} (?=[A-Z]{1,10}:\s))"
                  r"| \| [A-Z]{1,10} \| [\w.]{1,100} \| )")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# journald / syslog: `Nov 26 21:03:11 host python[1234]: ` (journalctl's default `short`, `short-precise` adds
# `.ffffff`); `-o short-iso` writes the ISO stamp of a container runtime before the same `host ident[pid]:`
SYSLOG_STAMP = r"(" + "|".join(MONTHS) + r") {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
SYSLOG_SOURCE = r"[^\s:]{1,255} [^\s\[\]:]{1,64}(?:\[\d{1,10}\])?:"
COMPOSE = r"[A-Za-z0-9][\w.-]{0,63} +\| "  # docker compose's `service-1  | ` before each line of a container
# Slurm's `srun --label`: the task number before each line of a task (`0: 2025-05-13T13:47:38.880Z ...`)
TASK_LABEL = r"(?:\d{1,6}: )"
# Rust's `tracing` format (and loggers that copy it: NVIDIA Dynamo's): after an RFC 3339 stamp, the level padded to
# five characters and the event's target: `2025-05-13T13:47:38.880Z  INFO metrics.log: `
TRACING = r" {1,2}(?:TRACE|DEBUG|INFO|WARN|ERROR) [\w.:-]{1,200}:"
# stern's `pod container ` before each line of a Kubernetes pod (lower-case DNS names), before vLLM's process
# prefix of a line that prints no time (`vllm-0 vllm (APIServer pid=1) INFO:     ...`)
STERN = r"(?:[a-z0-9][a-z0-9.-]{0,252} [a-z0-9][a-z0-9-]{0,62} )"
# NOTE: a line without a stamp or a vLLM prefix (a traceback's lines, print output) starts after any of these
LINE_START = (r"\[gpu(?:_id)?=(?P<gpu>\d+)\] ?|(?:Rank (?P<rank>\d+)|\[rank(?P<torch>\d+)\]): ?|"
              r"\[rank=(?P<early>\d+)\] |"  # SGLang 0.1's process rank before its start-up lines (sglang#485)
              + COMPOSE +
              r"|[^\s:]{1,300}:\d+: \w{0,40}Warning: |\*\*(?=\S)"
              # vLLM's source tag, pasted from after its time (vllm#25350), or its process in brackets before it
              # (`[Worker_TP1] [model_runner.py:411] `, rtx6kpro#103)
              r"|(?:\[(?P<process>[A-Za-z][\w-]{0,63})\] )?\[[\w.-]{1,200}\.py:\d+\] "
              # SGLang's rank tags without the stamp's time, a paste trimmed by hand (`[DP0 TP0] `, sglang#16974)
              r"|\[(?P<tags>[A-Z]{2,4}\d{1,4}(?: [A-Z]{2,4}\d{1,4}){0,3})\] "
              r"|" + TASK_LABEL + r"?(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"
              r"(?: (?:stdout|stderr) [FP]| " + SYSLOG_SOURCE + "|" + TRACING + r")? "
              # a log viewer's stamp and bar before each line (`2025-05-30 09:55:22.282 | `, vllm#18916); loguru's
              # default format goes on with the level and the place (`ERROR    | mod:fn:1 - `)
              r"|(?P<viewer>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,9})?) \| (?:[A-Z]{1,10} *\| [^\s|]{1,200} - )?"
              r"|(?P<syslog>" + SYSLOG_STAMP + r") " + SYSLOG_SOURCE + r" ")
VLLM_DEFAULT_YEAR = 2000
# A paste's markdown quote (`> `, `>> `, vllm#2140), or bash's continuation prompt: the markers and one blank
PASTE_QUOTE = r"(?:[ \t]{0,3}>){1,8} ?"
# A markdown code fence the paste glued to a line: ``` before a block's first line, or after its last (the stored
# text of syv-ai/qwen38-27b-rtx3090#68); the line is the text beside it
PASTE_FENCE = r"`{3,}"
# What a collector writes before SGLang's stamp (docker compose `sglang-1  | `, a container runtime's CRI
# `2025-11-11T04:06:27.123Z stdout F `, Ray's `(SGLangEngine pid=4242) `, journald's `Nov 11 04:06:27 host
# python[4242]: `). The per-line parser reads past any unquoted text before a stamp; the fast path strips
# exactly these forms (docs/log-formats.md §14). Both then take time and rank from the stamp alone.
# NOTE: no form admits a quote, `[` outside `[pid]`, or a newline, and every class that admits a digit admits
# all ten: a line equal to a matched prefix but for its digits has a prefix of the same form.
OUTER_PREFIXES: dict[str, str] = {
    "compose": COMPOSE,
    "cri": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d) (?:stdout|stderr) [FP] ",
    "ray": r"\([\w.:-]{1,64} pid=\d{1,10}(?:, ip=[\w.:-]{1,64})?\) ",
    "journald": r"(?:" + "|".join(MONTHS) + r") {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,6})? [\w.-]{1,64} [\w.-]{1,64}"
                r"(?:\[\d{1,10}\])?: ",
}
OUTER_PREFIX = "|".join(f"(?:{form})" for form in OUTER_PREFIXES.values())
# The Ray actors of RL frameworks that run the engine in the trainer's processes, on the same GPUs, by framework:
# verl's fused worker (actor, rollout and reference model in one process; EasyR1's too). Such an engine leaves the
# GPU memory it does not reserve to the trainer on purpose.
COLOCATED_ACTORS = {"WorkerDict": "verl"}
COLOCATED_ACTOR = r"\((" + "|".join(COLOCATED_ACTORS) + r") pid=\d{1,10}(?:, ip=[\w.:-]{1,64})?\) "
# vLLM's API server writes uvicorn's access lines after its process prefix alone, with no time:
# `(APIServer pid=N) INFO:     CLIENT - "..."`. NOTE: a name without digits names no rank (`process_rank`).
TIMELESS_PROCESS = r"\([A-Za-z_.-]{1,64} pid=\d{1,10}(?:, ip=[\w.:-]{1,64})?\) "

# -- stamp -> seconds ---------------------------------------------------------------------------------------

N = TypeVar("N")  # an int, or a numpy integer array


def is_date(year: N, month: N, day: N) -> N:
    """Whether the fields name a calendar day the clock reads (a day past a short month's end counts on)."""
    return (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)  # type: ignore[operator]


def days_since_epoch(year: N, month: N, day: N) -> N:
    """Days from 1970-01-01 to the date (proleptic Gregorian); valid where `is_date`."""
    march_based = month <= 2  # type: ignore[operator]
    y = year - march_based  # type: ignore[operator]
    era = y // 400
    of_era = y - era * 400
    of_year = (153 * (month - 3 + 12 * march_based) + 2) // 5 + day - 1  # type: ignore[operator]
    return era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468


def time_of_day(hour: N, minute: N, second: N) -> N:
    """Whole seconds since midnight (the fraction is added by the reader, as it printed it)."""
    return hour * 3600 + minute * 60 + second  # type: ignore[operator]


# -- rank tags and their names ------------------------------------------------------------------------------

_RANK_PARTS = re.compile(r"(?<![A-Za-z])(DP|TP|PP|EP)(\d+)")
_WORKER_RANK = re.compile(r"\brank=(\d+)")


def rank_name(tags: str) -> str:
    """SGLang's stamp tags as one rank name: `"  DP1  TP2 "` -> `"DP1 TP2"`."""
    return " ".join(tags.split())


def process_rank(process: str) -> str:
    """vLLM's process name as a rank: `EngineCore_DP1` -> `DP1`, `Worker_PP1_TP0` -> `PP1 TP0`, V1's
    multiprocessing `VllmWorker rank=7` -> `TP7` (its worker's rank), `APIServer` -> `""`."""
    parts = " ".join(f"{kind}{n}" for kind, n in _RANK_PARTS.findall(process))
    worker = _WORKER_RANK.search(process) if not parts else None
    return tp_rank(worker.group(1)) if worker else parts


def month_number(name: str) -> int:
    """syslog's month name as its number: `Nov` -> 11."""
    return MONTHS.index(name) + 1


def gpu_rank(gpu: str) -> str:
    """SGLang 0.2.5's `[gpu_id=N]` (or `[gpu=N]`) as a rank."""
    return f"GPU{gpu}"


def tp_rank(rank: str) -> str:
    """SGLang 0.1's `Rank N: ` and `[rank=N] `, and torch.distributed's `[rankN]: `, as a rank."""
    return f"TP{rank}"


def engine_rank(engine: int | None) -> str:
    """vLLM's stats line's engine (a DP rank): `Engine 001:` -> `DP1`; `N Engines Aggregated:` (None) -> `DP*`."""
    return f"DP{engine}" if engine is not None else "DP*"


# -- reading ----------------------------------------------------------------------------------------------------

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
