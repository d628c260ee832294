"""A diagnosis as report rows: the server's configuration, each finding's advice and evidence, what was read."""
from __future__ import annotations

from toolkit.diagnose.analysis import Diagnosis
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.prefix import clock_text

MAX_LINES_SHOWN = 12


def when(t: float | None) -> str:
    """A log-clock time (naive log timestamps read as UTC) as the log printed it."""
    return clock_text(t)


def server_rows(d: Diagnosis) -> list[tuple[str, object]]:
    return [(k, v) for k, v in d.config.summary().items() if v is not None]


def load_word(d: Diagnosis) -> str:
    """What the load lines are called in this log: SGLang's decode lines or vLLM's stats lines."""
    return "stats" if d.timeline.load_kind == "stats" else "decode"


def load_lines(d: Diagnosis) -> int:
    return len(d.timeline.load())


def retractions(d: Diagnosis) -> int:
    return len(d.timeline.kind("retract")) + len(d.timeline.kind("preempt"))


def change(f: Finding) -> tuple[str, str] | None:
    """("change", "--flag value") or ("do", what to do), or None when the finding asks for nothing."""
    return f.advice()


def evidence_summary(f: Finding) -> str:
    ev = f.evidence
    parts = [f"{ev.count} of {ev.total} lines ({ev.fraction:.0%})" if ev.total
             else f"{ev.count} record{'s' if ev.count != 1 else ''}"]
    if ev.span:
        parts.append(f"from {when(ev.span[0])} to {when(ev.span[1])}")
    if ev.lines:
        shown = ", ".join(map(str, ev.lines[:MAX_LINES_SHOWN]))
        parts.append(f"at lines {shown}{' ...' if len(ev.lines) > MAX_LINES_SHOWN else ''}")
    return " ".join(parts)


def facts(f: Finding) -> list[tuple[str, str]]:
    return [(k, f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in f.evidence.facts.items()
            if v is not None]


def window_text(d: Diagnosis) -> str:
    if d.window is None:
        return "the whole log"
    return f"the bench run's window, {when(d.window[0])} to {when(d.window[1])} on the log's clock"


def read_rows(d: Diagnosis) -> list[tuple[str, int]]:
    rows = sorted(d.stats.kinds.items(), key=lambda kv: -kv[1])
    return rows + [("other lines", d.stats.other), ("unread lines", d.stats.unread)]




def no_timeline_reason(d: Diagnosis) -> str:
    word = load_word(d)
    count = d.stats.kinds.get(d.timeline.load_kind, 0)
    if count == 0:
        return ("The log has no decode or stats lines, so there is no timeline: SGLang writes a decode line every "
                "--decode-log-interval decode steps (40 by default), so short outputs may leave none; a smaller "
                "interval or longer outputs give one. vLLM writes its stats line every 10 s while busy.")
    if d.window is not None:
        return (f"None of the log's {count} {word} lines fall inside the bench window: is this the log of the "
                "same run?")
    return f"The log's {count} {word} lines carry nothing to plot."
