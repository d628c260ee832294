"""The prefix before a message (docs/log-formats.md §1, §9.1): its grammars, the stamp -> seconds rule, rank tags
and their names, and where a message starts.

A message is recognised only where it starts, so a line that quotes one (a traceback's source line, an issue
title, a request body) is not that event. The prefixes, as `FORMS` declares them in the order they are tried:

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
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Literal, NamedTuple, TypeVar

from toolkit.diagnose.read.rank import NO_RANK, Rank, gpu_rank, process_rank, rank_name, tp_rank
from toolkit.diagnose.read.values import Fields, Value

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
# the names only vLLM's own processes print (V1's engine core and its DP copies, the API server, the workers of
# its multiprocessing executor): a line behind one of them is vLLM's even where it prints no logger stamp after it
# (an error a process wrote to stderr: `(EngineCore pid=112) torch.OutOfMemoryError: ...`). Not a Ray actor's
# name (verl's `WorkerDict`) nor a process named by any other program.
VLLM_OWN_PROCESS = r"(?:EngineCore|APIServer|ApiServer|VllmWorker|Worker)(?:[_ ][^()\s]{1,40})?"
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
# What a line without a stamp or a vLLM prefix (a traceback's lines, print output) may start with:
GPU_TAG = r"\[gpu(?:_id)?=(\d+)\] ?"  # SGLang 0.2.5's `[gpu_id=N]` (or `[gpu=N]`)
RANK_LABEL = r"(?:Rank (\d+)|\[rank(\d+)\]): ?"  # SGLang 0.1's `Rank N: `, torch.distributed's `[rankN]: `
EARLY_RANK = r"\[rank=(\d+)\] "  # SGLang 0.1's process rank before its start-up lines (sglang#485)
PYTHON_WARNING = r"[^\s:]{1,300}:\d+: \w{0,40}Warning: "
MARKDOWN_BOLD = r"\*\*(?=\S)"  # a line pasted into an issue
# vLLM's source tag, pasted from after its time (vllm#25350; before 0.7 without its `[`: `scheduler.py:648] `,
# vllm#10440), or its process in brackets before it (`[Worker_TP1] [model_runner.py:411] `, rtx6kpro#103)
VLLM_SOURCE_TAG = r"\[[\w.-]{1,200}\.py:\d+\] "
VLLM_SOURCE = r"\[?[\w.-]{1,200}\.py:\d+\] "
BRACKETED_PROCESS = r"\[([A-Za-z][\w-]{0,63})\] " + VLLM_SOURCE_TAG
# SGLang's rank tags without the stamp's time, a paste trimmed by hand (`[DP0 TP0] `, sglang#16974)
BARE_RANK_TAGS = r"\[([A-Z]{2,4}\d{1,4}(?: [A-Z]{2,4}\d{1,4}){0,3})\] "
ISO_STAMP = (TASK_LABEL + r"?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"
             r"(?: (?:stdout|stderr) [FP]| " + SYSLOG_SOURCE + "|" + TRACING + r")? ")
# a log viewer's stamp and bar before each line (`2025-05-30 09:55:22.282 | `, vllm#18916); loguru's default format
# goes on with the level and the place (`ERROR    | mod:fn:1 - `)
LOG_VIEWER = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,9})?) \| (?:[A-Z]{1,10} *\| [^\s|]{1,200} - )?"
SYSLOG = SYSLOG_STAMP + r" " + SYSLOG_SOURCE + r" "
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

# -- the line forms, in the order they are tried ----------------------------------------------------------------

Where = Literal["closest", "anywhere", "start", "after process", "after"]


class LineForm(NamedTuple):
    """One way a line's prefix is written. `where` it stands: `closest`, the first of its kind with only unquoted
    text before it, or the last of those that directly follow that one (a collector's stamp, then the engine's);
    `anywhere` after unquoted text; `start` at the line's start; `after process` at the start after a vLLM process
    name if any (`EngineCore_0 pid=N) `, the process names the rank where nothing else does); `after`: only right
    after another form (in its `then`). `clock` and `rank` name how its groups give the time and the rank (their
    reader, the index of its first group); `then` lists forms tried in turn at its end, each a tuple of
    alternatives, that belong to the prefix (the first form keeps the time; a later one names the rank, unless
    `rank_if_none`: only where none is named yet). `vllm`: vLLM's own logger wrote the line. `needs` (a substring)
    and `quick` (a regex) are in every line of the form, and every prefix of it `opens` with its text: tried first,
    they spare the full pattern most lines."""

    name: str
    pattern: str
    where: Where
    clock: tuple[str, int] | None = None
    rank: tuple[str, int] | None = None
    then: tuple[tuple[str, ...], ...] = ()
    vllm: bool = False
    rank_if_none: bool = False
    needs: str = ""
    quick: str | None = None
    opens: str = ""


_COLLECTED = (("process",),)  # what may follow a collector's prefix: a vLLM process name (an access line's)
FORMS: tuple[LineForm, ...] = (
    LineForm("sglang", SGLANG_STAMP, "closest", ("date", 0), ("tags", 7), (("gpu", "source level"), ("vllm",)),
             needs="[", quick=r"\[\d"),  # NOTE: the quick test: `[`, then TIME's first digit (a date's or an hour's)
    LineForm("vllm", VLLM_PREFIX, "anywhere", ("month day", 1), ("process", 0), vllm=True, needs=":",
             quick=VLLM_LEVELS + r" \d\d-\d\d "),
    LineForm("python logging", PYTHON_LOGGING, "anywhere", ("date", 0),
             quick=r":\d\d(?:(?:[,.]\d{3})?(?: - | \[[A-Z]| [a-z_])| \| )"),
    # pasted from after the stamp's `[` (`2025-02-09 10:14:05 TP0] Decode batch. ...`), from inside its year (its
    # date lost: no time), from after vLLM's level (`11-21 00:12:08 llm_engine.py:624] Avg prompt ...`)
    LineForm("sglang cut", SGLANG_STAMP_CUT, "start", ("date", 0), ("tags", 7)),
    LineForm("sglang cut in year", SGLANG_STAMP_YEAR_CUT, "start", rank=("tags", 0)),
    LineForm("vllm cut", VLLM_STAMP, "start", ("month day", 0), vllm=True),
    LineForm("pid and file", PID_FILE_LOGGING, "start", ("date", 0), ("tags", 7)),
    LineForm("gpu", GPU_TAG, "after process", rank=("gpu", 0), rank_if_none=True, opens="[gpu"),
    LineForm("rank label", RANK_LABEL, "after process", rank=("tp", 0)),
    LineForm("early rank", EARLY_RANK, "after process", rank=("tp", 0)),
    LineForm("compose", COMPOSE, "after process", then=_COLLECTED),
    LineForm("python warning", PYTHON_WARNING, "after process", then=_COLLECTED),
    LineForm("markdown bold", MARKDOWN_BOLD, "after process", then=_COLLECTED),
    LineForm("bracketed process", BRACKETED_PROCESS, "after process", rank=("process", 0)),
    LineForm("vllm source", VLLM_SOURCE, "after process", then=_COLLECTED),
    LineForm("bare rank tags", BARE_RANK_TAGS, "after process", rank=("tags", 0)),
    LineForm("iso stamp", ISO_STAMP, "after process", ("iso", 0), then=_COLLECTED),
    LineForm("log viewer", LOG_VIEWER, "after process", ("iso", 0), then=_COLLECTED),
    LineForm("syslog", SYSLOG, "after process", ("syslog", 0), then=_COLLECTED),
    LineForm("source level", SOURCE_LEVEL, "after", opens="["),
    LineForm("process", VLLM_PROCESS, "after", rank=("process", 0), opens="("),
)

# -- stamp -> seconds ---------------------------------------------------------------------------------------

N = TypeVar("N")  # an int, or a numpy integer array
T = TypeVar("T")


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


def month_number(name: str) -> int:
    """syslog's month name as its number: `Nov` -> 11."""
    return MONTHS.index(name) + 1


# -- reading ----------------------------------------------------------------------------------------------------

_QUOTES = ("\"", "'", "`")
_TIME = re.compile(TIME)


class Prefix(NamedTuple):
    """The prefix of one line: `time` (None when it prints none), `rank`, `start` of the message, `period`
    (seconds after which the clock wraps: a day for `HH:MM:SS`, a year for vLLM; None when dated), and `vllm`:
    vLLM's own logger wrote it (`LEVEL MM-DD HH:MM:SS [file.py:N] `), or one of vLLM's own processes printed it
    with no stamp after its name (`VLLM_OWN_PROCESS`), which names the engine of a log whose messages could be
    either's (an OOM, a traceback)."""

    time: float | None
    rank: Rank
    start: int
    period: float | None = None
    vllm: bool = False


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


def vllm_clock(month: str, day: str, hour: str, minute: str, second: str,
               fraction: str | None) -> tuple[float, float | None] | None:
    """(seconds, period) of vLLM's year-less `MM-DD HH:MM:SS(.ffffff)`, None where `MM-DD` is no calendar date."""
    return _clock(None, month, day, hour, minute, second, fraction, VLLM_DEFAULT_YEAR)


_CLOCKS: dict[str, Callable[[Sequence[str | None]], tuple[float, float | None] | None]] = {
    "date": lambda g: _clock(*g[:7]),  # year (None: no date), month, day, hour, minute, second, fraction
    "month day": lambda g: vllm_clock(*g[:6]),  # vLLM's year-less clock
    "iso": lambda g: _clock(*_TIME.match(g[0].replace("T", " ")).groups()),  # type: ignore[arg-type,union-attr]
    # journald's `Nov 26 21:03:11` prints no year: it reads as vLLM's month-day clock does
    "syslog": lambda g: _clock(None, str(month_number(g[0])), *g[1:6], VLLM_DEFAULT_YEAR),  # type: ignore[arg-type]
}
_RANKS: dict[str, Callable[[Sequence[str | None]], Rank]] = {
    "tags": lambda g: rank_name(g[0] or ""),
    "process": lambda g: process_rank(g[0] or ""),
    "gpu": lambda g: gpu_rank(g[0]),  # type: ignore[arg-type]
    "tp": lambda g: tp_rank(next(n for n in g if n is not None)),
}


class _Form:
    """A `LineForm` compiled: its pattern, where it stands, how its groups give the time and the rank, and the
    forms that may follow it."""

    __slots__ = ("form", "pattern", "first", "quick", "needs", "opens", "where", "clock", "rank", "then", "groups",
                 "vllm", "rank_if_none")

    def __init__(self, form: LineForm) -> None:
        self.form = form
        self.pattern = re.compile(form.pattern)
        self.groups = self.pattern.groups
        # NOTE: the first of its kind, lazily, only unquoted text before it
        self.first = re.compile(r"[^\"'`]*?" + form.pattern) if form.where == "closest" else None
        self.quick = re.compile(form.quick) if form.quick is not None else None
        self.needs, self.opens, self.vllm, self.rank_if_none = form.needs, form.opens, form.vllm, form.rank_if_none
        self.where = {"closest": self._closest, "anywhere": self._anywhere, "start": self.pattern.match}.get(form.where)
        self.clock = _at(_CLOCKS[form.clock[0]], form.clock[1]) if form.clock is not None else None
        self.rank = _at(_RANKS[form.rank[0]], form.rank[1]) if form.rank is not None else None
        self.then: tuple[tuple[_Form, ...], ...] = ()  # filled once every form is compiled

    def found(self, line: str) -> re.Match[str] | None:
        """The form's prefix in `line` where it stands (not `after process` forms: those are matched together)."""
        if self.needs not in line or (self.quick is not None and self.quick.search(line) is None):
            return None
        return self.where(line)

    def _closest(self, line: str) -> re.Match[str] | None:
        m = self.first.match(line)  # type: ignore[union-attr]
        while m is not None and (nxt := self.pattern.match(line, m.end())) is not None:
            m = nxt
        return m

    def _anywhere(self, line: str) -> re.Match[str] | None:
        m = self.pattern.search(line)
        return m if m is not None and _unquoted(line[: m.start()]) else None

    def prefix(self, line: str, groups: Sequence[str | None], end: int) -> Prefix:
        clock = self.clock(groups) if self.clock is not None else None
        time, period = clock if clock is not None else (None, None)
        found = Prefix(time, self.rank(groups) if self.rank is not None else NO_RANK, end, period, self.vllm)
        for stage in self.then:
            for form in stage:
                if line.startswith(form.opens, found.start) and (m := form.pattern.match(line, found.start)):
                    found = form.followed(found, m)
                    break
        return found

    def followed(self, outer: Prefix, m: re.Match[str]) -> Prefix:
        """`outer` read on past this form, which follows it: the message starts after it; the time stays outer's."""
        rank = self.rank(m.groups()) if self.rank is not None else NO_RANK
        rank = (outer.rank or rank) if self.rank_if_none else (rank or outer.rank)
        return Prefix(outer.time, rank, m.end(), outer.period, outer.vllm or self.vllm)


def _at(read: Callable[[Sequence[str | None]], T], first: int) -> Callable[[Sequence[str | None]], T]:
    """`read` of the groups from `first` on."""
    return (lambda groups: read(groups[first:])) if first else read


_FORMS = {form.name: _Form(form) for form in FORMS}
for _compiled in _FORMS.values():
    _compiled.then = tuple(tuple(_FORMS[name] for name in stage) for stage in _compiled.form.then)
_ALONE = tuple((f.needs, f.quick.search if f.quick else None, f.where, f) for f in _FORMS.values()
               if f.form.where in ("closest", "anywhere", "start"))
_AT_START = tuple(f for f in _FORMS.values() if f.form.where == "after process")
# NOTE: the `after process` forms, one alternation in table order: the first that matches wins, in one match
_AT_START_ANY = re.compile("|".join(f"(?P<f{i}>{f.form.pattern})" for i, f in enumerate(_AT_START)))
_AT_START_GROUPS = {f"f{i}": (f, _AT_START_ANY.groupindex[f"f{i}"]) for i, f in enumerate(_AT_START)}
# a vLLM process name at the line's start, after stern's names if any; or without its `(` where a paste began right
# after it (vLLM's process names are CamelCase: `EngineCore_0 pid=N) `)
_VLLM_OWN_PROCESS = re.compile(VLLM_OWN_PROCESS)
_PROCESS_FIRST = re.compile(r"(?:" + STERN + r"?\(|(?=[A-Z]))" + VLLM_PROCESS_BODY)
_VLLM = _FORMS["vllm"].pattern
_VLLM_CLOCK = _FORMS["vllm"].quick
_SOURCE_LEVEL = _FORMS["source level"].pattern


def read_prefix(line: str) -> Prefix:
    """The time, rank and message start of `line`, read by the first of `FORMS` it holds; no time and no rank where
    it names none."""
    for needs, quick, where, form in _ALONE:
        if needs in line and (quick is None or quick(line) is not None) and (m := where(line)) is not None:
            return form.prefix(line, m.groups(), m.end())
    process = _PROCESS_FIRST.match(line) if "pid=" in line else None
    at = process.end() if process else 0
    m = _AT_START_ANY.match(line, at)
    if m is None:
        if process is None:
            return Prefix(None, NO_RANK, at, None)
        own = _VLLM_OWN_PROCESS.fullmatch(process.group(1)) is not None
        return Prefix(None, process_rank(process.group(1)), at, None, own)
    form, group = _AT_START_GROUPS[m.lastgroup]  # type: ignore[index]
    return form.prefix(line, m.groups()[group: group + form.groups], m.end())


_COLOCATED = re.compile(COLOCATED_ACTOR)


def colocated_actor(line: str, end: int) -> re.Match[str] | None:
    """A colocated RL framework's Ray actor in the prefix of `line` (before `end`)."""
    return _COLOCATED.search(line, 0, end)


def _colocated(text: str) -> dict[str, Value]:
    m = _COLOCATED.search(text)
    return {"framework": COLOCATED_ACTORS[m.group(1)]} if m is not None else {}


# the facts a prefix tells (`messages.FACT_KINDS`), each read from the prefix that tells it
FACT_FIELDS = {"vllm_logger": Fields(lambda prefix: {}, {}), "colocated": Fields(_colocated, {"framework": str})}
_SGLANG, _FIRST_SGLANG = _FORMS["sglang"].pattern, _FORMS["sglang"].first  # a stamp; the first, where it stands
_closest_stamp = _FORMS["sglang"].found  # the SGLang stamp closest to the message


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
