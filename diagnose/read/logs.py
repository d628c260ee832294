"""Reading logs into records: the fast path for the chunks' hot lines, the per-line parser for the rest.

For each source, chunks are scanned ahead on worker threads (`diagnose.read.fastpath`); the caller hands each
chunk's slow lines, in order, to one `LineParser`, and keeps the hot batch lines as columns. Access lines are
counted, never kept. With `fast=False` every line takes the per-line path (the reference the fast path is
tested against). A `tap` (`--export`'s `EventStash`) is handed each chunk's events as they are read, and gives
the chunk scanners a job.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from operator import itemgetter
from pathlib import Path
from typing import Protocol

import numpy as np

from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.fastpath.ahead import (Job, LineTooLong, ReadChunk, runs, samples, scanned_chunks,
                                              scanned_ranges, use_processes)
from toolkit.diagnose.read.lines import LineParser, ParseStats
from toolkit.diagnose.read.eras import GPU_TAG, era_of, vllm_generation
from toolkit.diagnose.read.messages import BATCH_KINDS, FACT_KINDS
from toolkit.diagnose.read.prefix import YEAR, read_prefix, window_on_clock
from toolkit.diagnose.read.rank import Rank
from toolkit.diagnose.read.series import BatchTableBuilder, LogRecords, merge_parts
from toolkit.diagnose.read.source import Chunk, LineReader, cleaned, decode_lines, open_log

SERIES_KINDS = frozenset({"retract", "preempt", "oom", "watchdog", "exception", "leak", "spec_metrics",
                          "prefix_cache", "shed", "queue_timeout", "client_gone", "kv_transfer_failed"})


class Tap(Protocol):
    """What sees every event of the files read, chunk by chunk (`chunk`, with the hot lines the per-line parser
    took), then each file's last records (`tail`), then all the records (`read`: before the analysis reads them);
    `job` runs where each chunk is scanned."""

    job: Job

    def chunk(self, source: int, first: int, read: ReadChunk, events: list[Event], routed: list[int]) -> None: ...

    def tail(self, source: int, events: list[Event]) -> None: ...

    def read(self, records: LogRecords, stats: ParseStats) -> None: ...


class _Sink:
    """Where events go: batch kinds to the table builder (per chunk), the others by kind; access dropped."""

    def __init__(self, builder: BatchTableBuilder) -> None:
        self.builder = builder
        self.events: dict[str, list[Event]] = {}
        self.batch: list[Event] = []
        self.samples: dict[str, str] = {}

    def take(self, events: list[Event], hot: Sequence[tuple[int, str, str]] = ()) -> None:
        """Keep the events, and the first and last message of each batch kind in line order among their batch
        events and `hot` (line, kind, message) samples of the hot lines read with them."""
        batch = []
        for e in events:
            if e.kind in BATCH_KINDS:
                self.batch.append(e)
                batch.append((e.line, e.kind, e.text))
            elif e.kind != "access":
                self.events.setdefault(e.kind, []).append(e)
        for _, kind, text in sorted([*batch, *hot], key=itemgetter(0)) if hot else batch:
            self.sample(kind, text)

    def sample(self, kind: str, text: str) -> None:
        self.samples.setdefault(kind, text)
        self.samples[f"{kind}#last"] = text

    def flush(self, fast: dict[str, dict[str, np.ndarray]] | None = None) -> None:
        slow = self.builder.events_parts(self.batch) if self.batch else {}
        self.batch = []
        fast = fast or {}
        for kind in BATCH_KINDS:
            a, b = fast.get(kind), slow.get(kind)
            if a is not None and b is not None:
                self.builder.add_columns(kind, merge_parts(a, b))
            elif a is not None or b is not None:
                self.builder.add_columns(kind, a if a is not None else b)  # type: ignore[arg-type]


def read_logs(paths: Sequence[str | Path] = (), lines: Iterable[str] | None = None, stats: ParseStats | None = None,
              window: tuple[float, float] | None = None, fast: bool = True, tap: Tap | None = None) -> LogRecords:
    """Records of every source: files (plain, gzip, `-` for stdin) in order, then `lines` if given.
    `window=(t0, t1)` keeps only the time series inside it (start-up lines are always kept). `tap` sees every
    event of the files (not of `lines`), windowed or not."""
    stats = stats if stats is not None else ParseStats()
    sink = _Sink(BatchTableBuilder())
    for source, path in enumerate(paths):
        _read_path(path, source, stats, sink, fast, tap)
    if lines is not None:
        _read_lines(lines, len(paths), stats, sink)
    events = sink.events
    if window is not None:
        window = window_on_clock(window, _latest_time(sink))
        events = {kind: [e for e in rows if _inside(e, window)] for kind, rows in events.items()}
    ranks = sink.builder.ranks
    records = LogRecords(batches=sink.builder.build(window), events=events, ranks=ranks,
                         batch_kinds=frozenset(kind for kind in BATCH_KINDS if kind in sink.samples),
                         era=_era(sink.samples, events, ranks),
                         vllm_generation=vllm_generation(sink.samples.get("stats")))
    if tap is not None:
        tap.read(records, stats)
    return records


def _era(samples: Mapping[str, str], events: Mapping[str, list[Event]], ranks: list[Rank]) -> str | None:
    """The SGLang era the forms of the log prove: its batch lines' first and last texts, its other messages' (their
    first and last of each kind), a GPU's rank tag."""
    texts = dict(samples)
    if any(r.gpu is not None for r in [*ranks, *(e.rank for rows in events.values() for e in rows)]):
        texts["rank tag"] = GPU_TAG
    for kind, rows in events.items():
        if rows and kind not in FACT_KINDS:
            texts.setdefault(kind, rows[0].text)
            texts.setdefault(f"{kind}#last", rows[-1].text)
    return era_of(texts)


def _latest_time(sink: _Sink) -> float | None:
    """The latest time the log printed, which tells the clock it keeps: dated wherever any line is dated, else
    vLLM's year-less clock or time of day only (the same answer whichever path read the lines)."""
    times = [e.time for rows in sink.events.values() for e in rows if e.time is not None]
    found = sink.builder.latest_time()
    return max(times + ([found] if found is not None else []), default=None)


def _inside(e: Event, window: tuple[float, float]) -> bool:
    return e.kind not in SERIES_KINDS or (e.time is not None and window[0] <= e.time <= window[1])


def _read_lines(lines: Iterable[str], source: int, stats: ParseStats, sink: _Sink) -> None:
    parser = LineParser(source, stats)
    batch: list[str] = []
    no = 1
    for line in lines:
        batch.append(cleaned(line.rstrip("\n")))
        if len(batch) >= 8192:
            sink.take(parser.feed(batch, no))
            sink.flush()
            no, batch = no + len(batch), []
    sink.take(parser.feed(batch, no))
    sink.take(parser.finish() + parser.facts)
    sink.flush()


def _read_path(path: str | Path, source: int, stats: ParseStats, sink: _Sink, fast: bool, tap: Tap | None) -> None:
    parser = LineParser(source, stats)
    no, offset = 1, 0
    job = tap.job if tap is not None else None
    if fast and use_processes(path):
        try:
            before = {kind: sink.builder.rows(kind) for kind in BATCH_KINDS}
            # NOTE: closed however the loop ends: its workers stop before a caller's stash goes (`closing`)
            with closing(scanned_ranges(path, chunk_size(), job=job)) as ranges:
                for chunk in ranges:
                    no += _read_chunk(chunk, no, parser, sink, tap)
                    if before is not None:
                        # NOTE: the first range tells how many batch lines the file holds, about.
                        count = os.path.getsize(path) / chunk_size()
                        for kind, rows in before.items():
                            sink.builder.reserve(kind, rows + int((sink.builder.rows(kind) - rows) * count * 1.1))
                        before = None
            offset = -1
        except LineTooLong as too_long:
            offset = too_long.offset
    if offset >= 0:
        with open_log(path) as stream:
            if offset:
                stream.seek(offset)
            reader = LineReader(stream)
            chunks = scanned_chunks(reader.chunks(), job=job) if fast else (_whole(c) for c in reader.chunks())
            with closing(chunks):  # NOTE: its scan threads stop however the loop ends (see above)
                for chunk in chunks:
                    if chunk.cut:
                        reader.note_cut(no)
                    no += _read_chunk(chunk, no, parser, sink, tap)
            reader.report_cuts(stats)
    tail = parser.finish()
    if tap is not None:
        tap.tail(source, tail)
    sink.take(tail + parser.facts)
    sink.flush()


def chunk_size() -> int:
    """The chunk size, read at call time (tests make chunks small)."""
    from toolkit.diagnose.read import source

    return source.CHUNK


def _whole(chunk: Chunk) -> ReadChunk:
    """A chunk every line of which takes the per-line path."""
    lines = decode_lines(memoryview(chunk.data)[: chunk.size])
    return ReadChunk(len(lines), np.ones(len(lines), bool), None, [], 0, chunk.cut, lambda begin, end: lines[begin:end])


def _read_chunk(chunk: ReadChunk, first: int, parser: LineParser, sink: _Sink, tap: Tap | None) -> int:
    """Read one chunk whose first line is number `first`; returns its number of lines."""
    if chunk.lines == 0:
        return 0
    events, routed = read_chunk_lines(parser, chunk, first)
    if tap is not None:
        tap.chunk(parser.source, first, chunk, events, routed)
    if chunk.columns is None:
        sink.take(events)
        sink.flush()
        return chunk.lines
    sink.take(events, _hot_samples(chunk, first, routed))
    sink.flush(_hot_columns(chunk, first, parser, sink.builder, routed))
    return chunk.lines


def _hot_samples(chunk: ReadChunk, first: int, routed: list[int]) -> list[tuple[int, str, str]]:
    """(line, kind, message) of the first and last hot line of each batch kind (those the per-line parser took are
    its events)."""
    picks = []
    for kind, i in samples(chunk.columns):
        if i not in routed:
            text = chunk.texts(i, i + 1)[0]
            picks.append((first + i, kind, text[read_prefix(text).start:]))
    return picks


def read_chunk_lines(parser: LineParser, chunk: ReadChunk, first: int) -> tuple[list[Event], list[int]]:
    """The events of the lines of a chunk (its first line is number `first`) the per-line parser reads, in order,
    and the hot lines it read (`routed`: an open multi-line record decides for itself whether the next line
    continues it). It reads the loud lines (slow, not plain); plain lines and hot ones are only counted while no
    record is open. Runs of lines, not lines, are the Python loop: a long log's loud lines are few."""
    loud = chunk.slow if chunk.plain is None else chunk.slow & ~chunk.plain
    plain_before = None if chunk.plain is None else np.concatenate(([0], np.cumsum(chunk.plain))).tolist()
    events: list[Event] = []
    routed: list[int] = []
    clock = _StatsClock(chunk, parser)
    for begin, end, is_loud in runs(loud):
        if is_loud:
            events += parser.feed(chunk.texts(begin, end), first + begin)
            continue
        at = begin
        while at < end and parser.open_record:
            events += parser.feed(chunk.texts(at, at + 1), first + at)
            if not chunk.slow[at]:
                routed.append(at)
            at += 1
        if at == end:
            continue
        clock.read(at, end)
        skipped = plain_before[end] - plain_before[at] if plain_before is not None else 0
        if skipped:
            parser.skip_plain(skipped, first + end - 1)
        parser.stamped = parser.stamped or chunk.stamped(at, end)
        if not parser.begun and skipped < end - at:
            parser.begun = True  # NOTE: the run holds a hot line: an event, read here as the parser would
    return events, routed


class _StatsClock:
    """The hot stats lines' times on the per-line parser's clock: each run of them gets the wraps `feed` would
    add, in line order with the lines it reads (a year-less clock wraps at the new year). The times are put in
    the chunk's own columns: the table and the tap take them from there."""

    def __init__(self, chunk: ReadChunk, parser: LineParser) -> None:
        self.parser = parser
        self.columns = (chunk.columns or {}).get("stats")
        if self.columns is not None:
            self.line, self.time = self.columns["line"], self.columns["time"].copy()
            self.columns["time"] = self.time

    def read(self, begin: int, end: int) -> None:
        """Put the hot stats lines in [begin, end) on the clock."""
        if self.columns is None:
            return
        a, b = np.searchsorted(self.line, (begin, end)).tolist()
        if a < b:
            self.time[a:b] = self.parser.on_clock(self.time[a:b], YEAR)


def _hot_columns(chunk: ReadChunk, first: int, parser: LineParser, builder: BatchTableBuilder,
                 routed: list[int]) -> dict[str, dict[str, np.ndarray]]:
    """The chunk's hot batch lines as table columns by kind, counted in the parser's stats (routed lines are
    the per-line parser's)."""
    stats = parser.stats
    access = chunk.access - len(routed)  # routed lines that are batch lines are added back below
    out = {}
    codes = builder.rank_codes(chunk.ranks) if chunk.ranks else np.zeros(1, np.int16)
    for kind, part in (chunk.columns or {}).items():
        line = part["line"]
        keep = None
        if routed:
            mine = np.isin(line, routed)
            access += int(mine.sum())
            keep = np.flatnonzero(~mine)
            line = line[keep]
        stats.kinds[kind] += len(line)
        if not len(line):
            continue
        columns = {"source": np.full(len(line), parser.source, np.int16), "line": line + first}
        for name, values in part.items():
            if name != "line":
                columns[name] = values if keep is None else values[keep]
        columns["rank"] = codes[columns["rank"]]
        out[kind] = columns
    stats.kinds["access"] += access
    stats.lines = max(stats.lines, first + chunk.lines - 1)
    return out
