"""The per-line parser: log lines -> `Event`s, in constant memory, for every SGLang era and vLLM
(docs/log-formats.md §1-§9). It is the reference: `diagnose.read.fastpath` reads the common lines of a block
vectorized and must give exactly what this gives.

Each line's prefix (time, rank, process) is read first; the message after it is classified by how it starts
(`diagnose.read.messages`). Multi-line records (tracebacks, hard OOM, leak warnings, vLLM's memory profile) are
joined into one event. Unreadable lines are counted in `ParseStats`, never raised.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import numpy as np

from toolkit.diagnose.read.batch import ACCEPT_LENGTH, QUEUE
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.launch import IN_CONTAINER, LAUNCH_COMMAND, LAUNCH_IN_CODE, PROGRAM_WORDS
from toolkit.diagnose.read.messages import (BATCH_KINDS, CONTINUATION, ERROR_KINDS, LINE_CONTINUES, OPENERS,
                                            PROGRESS_END, REFUSAL_WRAPPED, SELF_CONTINUING, TRACEBACK_FRAME,
                                            TRACEBACK_HEAD, error_in_text, kind_of, line_kind, lone_exception)
from toolkit.diagnose.read.errors import error_kinds, error_line
from toolkit.diagnose.read.prefix import (PASTE_FENCE, PASTE_QUOTE, Prefix, colocated_actor,
                                          glued_records, read_prefix, stamped_message_start)
from toolkit.diagnose.read.rank import NO_RANK, Rank, stats_rank

# NOTE: facts are never told by a line the fast path may read itself (both paths see the others); such lines name
# their engine by their kind
_READ_HOT = frozenset({*BATCH_KINDS, "access"})
MAX_RECORD_LINES = 200
MAX_RECORD_CHARS = 64 * 1024
MAX_EXAMPLES = 20
FAILURES = ERROR_KINDS | {"exception"}  # the records of a failure: a lone exception line counts only without one
_CONTINUATION = re.compile(CONTINUATION)


@dataclass(slots=True)
class ParseStats:
    """What the parser saw: every line is an event line, a continuation, `other` (readable, not an event),
    or unread (binary garbage, a label whose fields cannot be read, or a line cut at the length limit)."""

    lines: int = 0
    other: int = 0
    unread: int = 0
    kinds: Counter = field(default_factory=Counter)
    unread_examples: list[tuple[int, str]] = field(default_factory=list)

    def note_unread(self, line: int, text: str) -> None:
        self.unread += 1
        if len(self.unread_examples) < MAX_EXAMPLES:
            self.unread_examples.append((line, text[:300]))


@dataclass(slots=True)
class PendingRecord:
    """A multi-line record being joined: its opening line's kind, number, time and rank, and its lines; `quoted`:
    its opening line was pasted as a markdown quote (`> Traceback ...`), so are the lines that continue it."""

    kind: str
    line: int
    time: float | None
    rank: Rank
    parts: list[str]
    chars: int = 0
    quoted: bool = False
    headless: bool = False  # opened at a traceback's frame (the excerpt cut its head): only its error line's kinds
    lone: bool = False  # opened at an exception's last line on its own (`messages.lone_exception`)

    def add(self, text: str) -> bool:
        if len(self.parts) >= MAX_RECORD_LINES or self.chars >= MAX_RECORD_CHARS:
            return False
        self.parts.append(text)
        self.chars += len(text)
        return True


class LineParser:
    """Turns lines into events. One instance per source; it keeps only its clock and at most one open
    multi-line record, so memory does not grow with the log."""

    def __init__(self, source: int = 0, stats: ParseStats | None = None) -> None:
        self.source = source
        self.stats = stats if stats is not None else ParseStats()
        self.stamped = False  # a line with a time was seen: later lines without one continue records
        self.begun = False  # an event or a record was read: a traceback's frame no longer opens one
        self._record: PendingRecord | None = None
        self._wraps, self._last = 0.0, None  # clock wraps added, last time read (clocks without a date)
        self.facts: list[Event] = []  # what the lines' prefixes told (`FACT_KINDS`), each fact once
        self._told: set[str] = set()
        # lone exception lines held until the source ends: they count only where it holds no error record
        self._lone: list[Event] = []
        self._failed = False  # an error record was read (an exception's, or one of `ERROR_KINDS`)

    @property
    def open_record(self) -> bool:
        return self._record is not None

    def feed(self, lines: Iterable[str], first_line: int = 1) -> list[Event]:
        """Events for `lines`, numbered from `first_line`; call `finish()` at the end of the source."""
        events: list[Event] = []
        no = first_line - 1
        for no, line in enumerate(lines, first_line):
            for i, part in enumerate(records_of(line)):
                record = self._record
                if record is not None:
                    if self._continues(record, part):
                        continue
                    events += self._close(cut_off=_bare_head(record) and _opens_exception(part))
                event = self._event(part, no, glued=i > 0)
                if event is not None:
                    events.append(event)
        self._failed = self._failed or any(e.kind in FAILURES for e in events)
        self.stats.kinds.update(map(attrgetter("kind"), events))
        self.stats.lines = max(self.stats.lines, no)
        return events

    def skip_plain(self, count: int, last_line: int) -> None:
        """Count `count` plain lines (`is_plain`) read elsewhere as other: what `feed` does with them while no
        multi-line record is open (one that is open decides for itself whether they continue it)."""
        assert self._record is None, "an open record must read the next lines itself"
        self.stamped = True
        self.stats.other += count
        self.stats.lines = max(self.stats.lines, last_line)

    def finish(self) -> list[Event]:
        """The events of a multi-line record left open at the end of the source."""
        events = self._close() if self._record is not None else []
        self._failed = self._failed or any(e.kind in FAILURES for e in events)
        if not self._failed:
            events = sorted(self._lone + events, key=attrgetter("line"))
        self._lone = []
        self.stats.kinds.update(map(attrgetter("kind"), events))
        return events

    def _event(self, line: str, no: int, glued: bool = False) -> Event | None:
        """The event of a line, or of a record glued after another on it (`glued`): a glued stats record without
        its `Running:` count is read as cut by the excerpt (a paste that lost its newlines; a terminal wrapping the
        line inside its last record would be read so too), where the first record of a line may be wrapped onto the
        next line and is read."""
        prefix = read_prefix(line)
        if prefix.time is not None:
            self.stamped = True
        kind, start = message_kind(line, prefix)
        headless = kind is None and not self.begun and _FRAME.match(line, prefix.start) is not None
        if headless:
            kind = "exception"  # NOTE: the excerpt begins inside a traceback: its frames are one record, read for
            # the error its last line names (an OOM's own frames say where it happened: in graph capture, vllm#19186)
        if kind is None:
            if "\ufffd" in line or "\x00" in line:
                self.stats.note_unread(no, line)
            else:
                self.stats.other += 1
            return None
        time, text = self._clock(prefix), line[start:]
        if kind not in _READ_HOT and prefix.vllm:
            self._fact("vllm_logger", no, time, line[:start])
        if kind not in _READ_HOT and (m := colocated_actor(line, start)) is not None:
            self._fact("colocated", no, time, m.group(0), m.group(1))
        self.begun = True
        if kind in OPENERS:
            quoted = prefix.start == 0 and ">" in line[:start]
            self._record = PendingRecord(kind, no, time, prefix.rank, [text], len(text), quoted, headless,
                                         lone=kind == "exception" and lone_exception(line, start))
            return None
        if (kind in ("decode", "prefill") and not _readable_batch(kind, text)) or (glued and kind == "stats" and
                                                                                  "Running" not in text):
            self.stats.note_unread(no, line)
            return None
        rank = stats_rank(text, prefix.rank) if kind == "stats" else prefix.rank
        return Event(kind, no, time, rank, text, self.source)

    def _fact(self, kind: str, no: int, time: float | None, prefix: str, who: str = "") -> None:
        """Note a fact the line's prefix tells (read from that prefix), the first time it is told (by `who`)."""
        told = f"{kind} {who}"
        if told not in self._told:
            self._told.add(told)
            self.facts.append(Event(kind, no, time, NO_RANK, prefix, self.source))

    def _clock(self, prefix: Prefix) -> float | None:
        """The prefix's time, with the wraps of a clock without a date (or year) added."""
        if prefix.time is None or prefix.period is None:
            return prefix.time
        return self._wrapped(prefix.time, prefix.period)

    def _wrapped(self, time: float, period: float) -> float:
        t = time + self._wraps
        if self._last is not None and t < self._last - period / 2:
            self._wraps += period
            t += period
        self._last = t
        return t

    def on_clock(self, times: np.ndarray, period: float) -> np.ndarray:
        """The times of lines read elsewhere (in line order, all after the lines fed so far, on a clock of
        `period`), with the wraps `feed` would add reading them, added (and noted for the lines after)."""
        if not len(times):
            return times
        moved = times + self._wraps
        before = np.concatenate(([self._last if self._last is not None else -np.inf], moved[:-1]))
        if (moved >= before - period / 2).all():
            self._last = float(moved[-1])
            return moved
        return np.array([self._wrapped(t, period) for t in times.tolist()])

    def _continues(self, record: PendingRecord, line: str) -> bool:
        if record.headless and error_line(record.parts[-1]) is not None:
            return False  # NOTE: a tail ends at its error line (gpustack#1800: a whole traceback follows it)
        if record.quoted and (quote := _QUOTE_MARGIN.match(line)) is not None:
            line = line[quote.end():]  # NOTE: the quote's lines continue it as the lines it quotes would
        prefix = read_prefix(line)
        if record.kind == "launch_command":  # NOTE: only past a line continuation, and never into the log itself
            return (record.parts[-1].rstrip().endswith(LINE_CONTINUES) and prefix.time is None
                    and message_kind(line, prefix)[0] is None and record.add(line))
        if record.kind == "not_enough_memory":  # NOTE: one message: only its own wrapped words continue it
            message = line[prefix.start:].lstrip()
            return _REFUSAL_WRAPPED.match(message) is not None and record.add(message)
        message = line[prefix.start:]
        if record.kind in ERROR_KINDS and _wrapped_sentence(record.parts[-1], line, prefix):
            return record.add(message.strip())
        if record.lone and (message.startswith(TRACEBACK_HEAD) or line_kind(line, prefix.start) is not None):
            return False  # NOTE: an exception's last line on its own ends before another record begins
        if prefix.time is not None:
            # vLLM prints every line of a multi-line message with its prefix (a traceback line by line).
            looks_new = _CONTINUATION.match(message) is None and not (
                record.kind == "exception" and message.startswith("Traceback (most recent call last)"))
        elif self.stamped:
            looks_new = False
        else:
            # NOTE: a prefix without a time (`[rank0]: `) repeats on every line of the record: read past it.
            looks_new = _CONTINUATION.match(message) is None and message.strip() != ""
        if prefix.rank and record.rank and prefix.rank != record.rank:
            looks_new = True  # NOTE: another process's line (vLLM prefixes every line with its worker's rank)
        kind = kind_of(line, prefix.start)
        if kind is not None and kind != "exception":
            # NOTE: a leak warning's and vLLM's memory profile's later lines start like their first.
            looks_new = looks_new or not (kind == record.kind and kind in SELF_CONTINUING)
        return not looks_new and record.add(message)

    def _close(self, cut_off: bool = False) -> list[Event]:
        """The events of the open record; none of a traceback's bare head that another exception cut off at once
        (`cut_off`: its own header printed into it, sglang#1304)."""
        record = self._record
        assert record is not None
        self._record = None
        text = "\n".join(record.parts)
        kinds = [] if record.headless or cut_off else [record.kind]  # NOTE: a tail counts by its error line alone
        # (trl#3310)
        if record.kind in ("exception", "oom"):  # NOTE: a chained OOM record can end in a graph capture's failure
            kinds += [kind for kind in error_kinds(text) if kind not in kinds]
        if record.kind == "leak" and "leak detected" not in text and "Warning: available_size" in text:
            kinds = []
        if not kinds:
            self.stats.other += 1
        events = [Event(kind, record.line, record.time, record.rank, text, self.source) for kind in kinds]
        if record.lone and kinds == ["exception"]:
            # NOTE: an exception's last line on its own is its record only where the source holds no error record:
            # there it is a fragment of a failure read whole (the paste's repeat, another rank's copy: sglang#4048)
            if not self._failed:
                self._lone += events
            return []
        return events


def _bare_head(record: PendingRecord) -> bool:
    """A traceback's head with nothing of its own after it: `Traceback (most recent call last):`, no frame and no
    error line (at most a line that names no error, such as another process's header printed into it)."""
    return (record.kind == "exception" and record.parts[0].startswith(TRACEBACK_HEAD)
            and not any(_FRAME.match(part) or error_line(part) is not None for part in record.parts[1:]))


def _opens_exception(line: str) -> bool:
    """Whether `line` opens an exception record: then a bare traceback head before it was cut off by it, and is
    no record (a bare head the excerpt ends with is one: its traceback was left out)."""
    return message_kind(line, read_prefix(line))[0] == "exception"


def records_of(line: str) -> list[str]:
    """The records a line holds, each from its own start: vLLM's glued records (`glued_records`), and a
    traceback printed right after a progress bar's end (a bar's line ends in no newline: sglang#14476)."""
    parts = glued_records(unwrapped(line))
    last = parts[-1]
    if TRACEBACK_HEAD in last and (m := _AFTER_PROGRESS.search(last)) is not None:
        parts[-1:] = [last[: m.start()], last[m.start():]]
    return parts


def is_plain(line: str) -> bool:
    """A line `feed` counts as other and nothing more while no record is open: a readable line whose prefix has a
    time (so the log is stamped) and whose message is no event nor a traceback's frame (one opens a record where
    the log begins inside a traceback). The fast path's workers classify slow lines with it, so that the caller
    reads only the rest (`LineParser.skip_plain`)."""
    line = unwrapped(line)
    if TRACEBACK_HEAD in line:
        return False  # NOTE: after a progress bar it is a record of its own (`records_of`); anywhere, not plain
    start = stamped_message_start(line)
    if start is None:
        if len(glued_records(line)) > 1:
            return False
        prefix = read_prefix(line)
        if prefix.time is None:
            return False
        start = prefix.start
    return (line_kind(line, start) is None and _FRAME.match(line, start) is None and "\ufffd" not in line
            and "\x00" not in line)


def opens_record(line: str) -> bool:
    """Whether `feed` may open a multi-line record at `line` (read while none is open; at any of its glued
    records; a traceback's frame, where the log begins inside a traceback): only the next `RECORD_REACH` lines can
    then be read as part of it, or close it."""
    for part in records_of(line):
        prefix = read_prefix(part)
        if message_kind(part, prefix)[0] in OPENERS or _FRAME.match(part, prefix.start):
            return True
    return False


_CODE_SPAN = re.compile(r"`([^`]+)`\s*")
_GLUED_FENCES = re.compile(f"^{PASTE_FENCE}(?=[^`])|(?<=[^`]){PASTE_FENCE}\\s*$")


def unwrapped(line: str) -> str:
    """A line with a markdown code fence glued to its start or end is the text beside it; a whole line pasted as
    inline code (a backtick at each end, sglang#10088; inner pairs too, vllm#3435) is the line inside them; any other
    line as it is (a backtick inside a line opens a quote)."""
    if not line.startswith("`") and "`" not in line[-16:]:  # NOTE: a fence ends a line but for a few blanks
        return line
    if "```" in line:
        line = _GLUED_FENCES.sub("", line)
    if not line.startswith("`"):
        return line
    m = _CODE_SPAN.fullmatch(line)
    if m is not None:
        return m.group(1)
    # NOTE: a whole line in backticks that names code in backticks of its own (`` ` vllm-1  | ValueError: ...
    # increasing `gpu_memory_utilization` ...` ``, vllm#3435): the outer pair, the inner ones paired
    body = line.rstrip()
    if len(body) > 2 and body.endswith("`") and not body.startswith("``") and body.count("`") % 2 == 0:
        return body[1:-1].lstrip()
    return line


MAX_PASTE_INDENT = 3  # blanks a paste puts before a line (limo#29, vllm#5079: one)
_PASTE_MARGIN = re.compile(f"(?:{PASTE_QUOTE})?" + r"(\s*)")  # a paste's margin: its quote, then blanks
_QUOTE_MARGIN = re.compile(PASTE_QUOTE)
_LAUNCH_AT = re.compile(LAUNCH_COMMAND)
_FRAME = re.compile(TRACEBACK_FRAME)
_AFTER_PROGRESS = re.compile(f"(?<={PROGRESS_END}){re.escape(TRACEBACK_HEAD)}")
_LAUNCH_IN_CODE = re.compile(LAUNCH_IN_CODE)
_IN_CONTAINER = re.compile(IN_CONTAINER)
_REFUSAL_WRAPPED = re.compile(REFUSAL_WRAPPED)


def _wrapped_sentence(last: str, line: str, prefix: Prefix) -> bool:
    """Whether `line` goes on with an error message that a paste wrapped mid-sentence (llm-d#787: `... with 1024 `
    then `dummy requests. Please try lowering ...`): the part before it ends in a space, and the line has no time
    and starts no message of its own."""
    return (last.endswith(" ") and prefix.time is None and line.strip() != ""
            and message_kind(line, prefix)[0] is None)


def message_kind(line: str, prefix: Prefix) -> tuple[str | None, int]:
    """The kind of the message after `prefix` (`line_kind`) and where the message starts. A line without any
    prefix may be indented or quoted by the paste (` Sequence group 221 is preempted ...`, limo#29; `> torch.cuda.
    OutOfMemoryError: ...`, vllm#2140): where its first character is blank or `>` and no event starts there, the
    message starts after that margin. (A record's indented lines are read by the record first: they continue it.)
    A line without time may be the user's launch command, or hold one in inline code inside a sentence (vllm#2140)
    or after `docker run ... IMAGE` (sglang#4489): it starts there; or a traceback's head after other text
    (`router_init_state: Traceback ...`, sglang#485; a backtick, vllm#2785): the exception starts there. NOTE:
    never on a line with time, the engine's own (the fast path counts those plain from their message's start,
    where neither is looked for)."""
    kind = line_kind(line, prefix.start)
    if kind == "exception" and prefix.time is not None and lone_exception(line, prefix.start):
        # NOTE: Python prints an uncaught exception's last line without a stamp; a stamped `ValueError: ...` is a
        # logger's message about a request (vLLM's 400s), and the server serves on
        return None, prefix.start
    if kind is not None or prefix.time is not None:
        return kind, prefix.start
    start = prefix.start
    if prefix.start == 0 and (line[:1].isspace() or line[:1] == ">"):
        margin = _PASTE_MARGIN.match(line)
        if len(margin.group(1)) > MAX_PASTE_INDENT:
            return None, prefix.start  # NOTE: a source line of a traceback (4 spaces or more) is no event
        kind = line_kind(line, margin.end())
        if kind is not None:
            return kind, margin.end()
        start = margin.end()
    if any(word in line for word in PROGRAM_WORDS):
        command = _LAUNCH_AT.match(line, start)
        if command is not None:
            return "launch_command", start
        command = (_LAUNCH_IN_CODE.search(line, start) if "`" in line else None) or _IN_CONTAINER.match(line, start)
        if command is not None:
            return "launch_command", command.start(1)
    head = line.find(TRACEBACK_HEAD, start)
    if head > 0:  # NOTE: after other text: `router_init_state: Traceback ...` (sglang#485), a backtick (vllm#2785)
        return "exception", head
    error = error_in_text(line, start)
    if error is not None:
        return line_kind(line, error), error
    return None, prefix.start


RECORD_REACH = MAX_RECORD_LINES  # a record holds its first line and at most MAX_RECORD_LINES - 1 more; one closes it


def _readable_batch(kind: str, text: str) -> bool:
    """A batch line prints its counts: `#running-req`; a prefill line, `#queue-req` and its own counts instead (a
    PD prefill server prints `#unbootstrapped-req` / `#bootstrap-req` and no running count, docs/log-formats.md
    §3; a line clipped at a fixed width may lose it, sglang#25960); a decode line trimmed by hand to speculative
    decoding's figures, its `accept len` (sglang#16974)."""
    own = "bootstrap" in text or "new-token" in text
    counted = ("running" in text or (kind == "prefill" and QUEUE in text and own)
               or (kind == "decode" and ACCEPT_LENGTH in text))
    return counted and ": " in text


def parse_lines(lines: Iterable[str], source: int = 0, stats: ParseStats | None = None) -> Iterator[Event]:
    """Events from an iterable of lines (trailing newlines are dropped), streamed in batches."""
    parser = LineParser(source, stats)
    batch: list[str] = []
    no = 1
    for line in lines:
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= 4096:
            yield from parser.feed(batch, no)
            no += len(batch)
            batch = []
    yield from parser.feed(batch, no)
    yield from parser.finish()


def parse_path(path: str | Path, source: int = 0, stats: ParseStats | None = None) -> Iterator[Event]:
    """Events from a plain or gzip file, or stdin for `-`, streamed, every line read by the per-line parser."""
    from toolkit.diagnose.read.source import LineReader, decode_lines, open_log

    parser = LineParser(source, stats)
    with open_log(path) as stream:
        reader = LineReader(stream)
        no = 1
        for chunk in reader.chunks():
            lines = decode_lines(chunk.data[: chunk.size])
            if chunk.cut:
                reader.note_cut(no)
            yield from parser.feed(lines, no)
            no += len(lines)
        reader.report_cuts(parser.stats)
    yield from parser.finish()
