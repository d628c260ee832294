"""The prefix before a message (docs/log-formats.md §1, §9.1): stamp grammars, the stamp -> seconds rule, rank
tags and their names.

Times are seconds on the log's clock, naive stamps read as UTC (proleptic Gregorian, as `calendar.timegm`).
The arithmetic below is written with operators only, so the per-line parser calls it on ints and the fast path
on numpy arrays: one rule, two readers.
"""
from __future__ import annotations

import re
from typing import TypeVar

DAY = 86400.0
YEAR = 366 * DAY  # vLLM's `MM-DD` clock reads as the year 2000, a leap year

# -- stamp grammars (regex sources; `diagnose.prefix` compiles them) ------------------------------------------

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
