"""`--export events.csv|events.parquet`: every event of the logs, one row each, from the analysis's own read.

Columns: kind, time, timestamp, rank, line, source, text, then every field (absent fields empty). The column set
(and each field's type: number, boolean or text) is known once every log is read, so the rows wait for it: while
the logs are read, an `EventStash` keeps each chunk's hot batch, stats and access lines as the worker that scanned
it read them (numpy, pickled into a temporary directory beside the output; their text stays in the log, read again
when written) and the per-line parser's events of the chunk; then, on a thread of its own while the analysis runs,
each chunk's rows are made in line order and written, CSV formatted on `FORMATTERS` threads at once (Arrow's
writers release the GIL), into a file of the stash that replaces the output once whole (a failed command leaves the
output as it was). Arrow is imported, and its kernels built (0.2 s, once per process), on a thread of its own while
the logs are read (`EventStash.warm`): the read's workers never need it (their job is numpy only, and they import
nothing once forked), so a pool forked while that thread runs (a later log's) inherits nothing it uses. Arrays are
made by `arrow_arrays`, never `pyarrow.array` (which imports pandas). The stash takes about a third of the CSV's
size on disk (80 MB for the 1M-line benchmark log's 234 MB), each file removed once written, the directory when
done.
"""
from __future__ import annotations

import functools
import os
import pickle
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Self

import numpy as np

from toolkit.diagnose.read.arrow_arrays import booleans, empty_table, names, numbers, spans, texts, values_of
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.fastpath.access import access_fields
from toolkit.diagnose.read.fastpath.ahead import JobResult, ReadChunk, range_workers
from toolkit.diagnose.read.fastpath.fields import BOOLEAN
from toolkit.diagnose.read.fastpath.scan import ACCESS, ScannedChunk, stamp_times
from toolkit.diagnose.read.fastpath.words import Words
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.messages import FACT_KINDS, UVICORN_ACCESS
from toolkit.diagnose.read.series import META
from toolkit.diagnose.read.source import Chunk

if TYPE_CHECKING:
    import pyarrow as pa

    from toolkit.diagnose.analysis import Diagnosis
    from toolkit.diagnose.read.lines import ParseStats
    from toolkit.diagnose.read.series import BatchTable, LogRecords

FORMATS = (".csv", ".parquet")
BASE = ("kind", "time", "timestamp", "rank", "line", "source", "text")
FORMATTERS = 2  # threads formatting CSV: the read's workers are done by then
_KINDS = ("decode", "prefill", "access", "stats")  # a hot row's kind by code: the scan's, then stats
_ACCESS_CODE, _STATS = _KINDS.index("access"), _KINDS.index("stats")
assert _KINDS[_ACCESS_CODE] == "access" and _ACCESS_CODE == ACCESS, "the scan's kind codes"
_DERIVED = frozenset({"usage", "hit_rate", "phase", "after_idle"})
_ACCESS = {"client": "text", "method": "text", "path": "text", "status": "number"}


def field_types(batches: Mapping[str, BatchTable], events: Mapping[str, list[Event]],
                stats: ParseStats) -> dict[str, str]:
    """{field: "number" | "boolean" | "text"} of every field the logs' events have: their batch tables' columns
    (less those the timeline derives), their other events' fields (facts are no message: not exported), the access
    fields if any line was one."""
    types: dict[str, str] = {}
    for table in batches.values():
        for name in table.columns:
            if name not in META and name not in _DERIVED:
                types[name] = "boolean" if name in BOOLEAN else "number"
    for kind, rows in events.items():
        if kind in FACT_KINDS:
            continue
        for e in rows:
            for name, value in e.fields.items():
                types[name] = _merge(types.get(name), _type(value))
    if stats.kinds.get("access"):
        for name, kind in _ACCESS.items():
            types[name] = _merge(types.get(name), kind)
    return types


def _type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "text"


def _merge(old: str | None, new: str) -> str:
    return new if old is None or old == new else "text"


def check_export_path(out: str | Path) -> Path:
    """The export's file name, with a suffix it can write; raises ValueError otherwise."""
    out = Path(out)
    if out.suffix not in FORMATS:
        raise ValueError(f"--export needs a .csv or .parquet file name, not {out.name!r}")
    return out


@dataclass(slots=True)
class _Part:
    """One chunk as read: its source and first line number, the file of its hot lines (None: none), the
    file of the per-line parser's events of it (None: none), the hot lines that parser took (`routed`,
    numbered in the chunk) and the hot stats lines' times on the reader's clock (`stats_clock`: their lines in
    the chunk, their times). Nothing of a chunk stays in memory: a log the per-line parser reads whole has as
    many events as lines."""

    source: int
    first: int
    hot: str | None
    events: str | None
    routed: list[int] = field(default_factory=list)
    stats_clock: tuple[np.ndarray, np.ndarray] | None = None


class EventStash:
    """What `--export` keeps of the analysis's read until every log is read (the file's columns are known then),
    and the write that follows: the `tap` of `read_logs` (each chunk's events and hot lines' file, then all the
    records) and the `job` its workers run. A context manager: its temporary directory (beside the output, so it
    is on the same disk) goes when it closes, and with it a write that `write_events` did not see finish."""

    def __init__(self, out: str | Path) -> None:
        self.out = check_export_path(out)
        if not self.out.parent.is_dir():
            raise ValueError(f"no such directory: {self.out.parent}")
        if self.out.is_dir():
            raise ValueError(f"{self.out} is a directory")
        try:
            self.directory = tempfile.mkdtemp(prefix=".toolkit-export-", dir=self.out.parent)
        except OSError as exc:
            raise OSError(f"cannot write in {self.out.parent}: {exc.strerror}") from exc
        self.job = functools.partial(_hot_lines, self.directory)
        self.parts: list[_Part] = []
        self.arrow: Future | None = None
        self.writing: Future | None = None  # the write, on a thread of its own (`start_writing`)
        self._writer_thread: ThreadPoolExecutor | None = None
        self.stop = threading.Event()  # set when the command fails while the write runs
        self.written = False  # `write_events` saw the write finish

    def warm(self) -> None:
        """Import Arrow and build its kernels on a thread of its own (`_warm_arrow`), while the logs are read. Call
        it once the first log's worker processes are forked (`range_workers`): they never need Arrow."""
        if self.arrow is None:
            thread = ThreadPoolExecutor(1, thread_name_prefix="diagnose-arrow")
            self.arrow = thread.submit(_warm_arrow, self.out.suffix == ".parquet")
            thread.shutdown(wait=False)  # NOTE: the thread ends with its one task

    def chunk(self, source: int, first: int, read: ReadChunk, events: list[Event], routed: list[int]) -> None:
        stats = (read.columns or {}).get("stats")
        clock = (stats["line"], stats["time"]) if stats is not None else None
        extra: str | None = read.extra  # type: ignore[assignment]  # NOTE: the path `_hot_lines` wrote, or None
        self.parts.append(_Part(source, first, extra, self._spilled(events), routed, clock))

    def tail(self, source: int, events: list[Event]) -> None:
        if events:
            self.parts.append(_Part(source, 0, None, self._spilled(events)))

    def read(self, records: LogRecords, stats: ParseStats) -> None:
        """Every log is read, so the file's columns are known (the analysis adds none): the write starts now,
        while the analysis runs."""
        self.start_writing(field_types(records.batches, records.events, stats))

    def start_writing(self, types: dict[str, str]) -> None:
        """Write the stashed events with the columns of `types` on a thread of its own (once)."""
        if self.writing is None:
            self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="diagnose-export-write")
            self.writing = self._writer_thread.submit(_write_parts, self, types)

    def _spilled(self, events: list[Event]) -> str | None:
        if not events:
            return None
        handle, path = tempfile.mkstemp(suffix=".events", dir=self.directory)
        with os.fdopen(handle, "wb") as f:
            pickle.dump(events, f, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.writing is not None and not self.written:
                self.stop.set()  # NOTE: the command failed while the file was written: the write stops
                wait([self.writing])
        finally:
            if self._writer_thread is not None:
                self._writer_thread.shutdown()
            shutil.rmtree(self.directory, ignore_errors=True)


def export_events(paths: Sequence[str | Path], out: str | Path, **analysis) -> tuple[Diagnosis, Path]:
    """Analyse `paths` (with `analysis`'s keywords of `analyze`) and write their events to `out` (`.csv` or
    `.parquet`), in one read."""
    from toolkit.diagnose.analysis import analyze

    with EventStash(out) as stash, range_workers(read_ahead=paths[0] if paths else None, job=stash.job):
        stash.warm()
        d = analyze(paths, tap=stash, **analysis)
        return d, write_events(stash, d)


def write_events(stash: EventStash, d: Diagnosis) -> Path:
    """The events `stash` kept of the read `d` analysed, written to its output (chosen by the suffix): the write
    the end of the read started, or one started now. The file is written in the stash's directory and moved onto
    the output once whole: a failed command leaves whatever was there before."""
    if stash.writing is None:
        stash.start_writing(field_types(d.timeline.batches, d.timeline.events, d.stats))
    assert stash.writing is not None
    os.replace(stash.writing.result(), stash.out)
    stash.written = True
    return stash.out


def _write_parts(stash: EventStash, types: dict[str, str]) -> str:
    """The stash's parts in order, as rows of the columns of `types`, in a file of the stash's directory: its
    path. Stops between parts once `stash.stop` is set."""
    if stash.arrow is not None:
        stash.arrow.result()
    schema = _schema(types)
    path = os.path.join(stash.directory, "events" + stash.out.suffix)
    with _writer(Path(path), schema) as write:
        for part in stash.parts:
            if stash.stop.is_set():
                break
            write(functools.partial(_part_table, part, schema))
        if not stash.parts:
            write(functools.partial(empty_table, schema))
    return path


class _writer:
    """The CSV or Parquet sink, given each chunk's table to make. CSV: each made and formatted on one of
    `FORMATTERS` threads, written in order; Parquet: made by the caller, written on a thread of its own while the
    caller makes the next. At most `AHEAD` tables wait."""

    AHEAD = 3

    def __init__(self, out: Path, schema: pa.Schema) -> None:
        self.out, self.schema = out, schema
        self.csv = out.suffix == ".csv"
        self.thread = ThreadPoolExecutor(FORMATTERS if self.csv else 1, thread_name_prefix="diagnose-export")
        self.pending: deque[Future] = deque()
        self.sink: object = None

    def __enter__(self) -> Callable[[Callable[[], pa.Table]], None]:
        if self.csv:
            self.sink = open(self.out, "wb")
            self.sink.write(_csv(empty_table(self.schema), header=True))  # type: ignore[attr-defined]
        else:
            import pyarrow.parquet as pq  # NOTE: here only: a CSV export does not wait for it

            self.sink = pq.ParquetWriter(str(self.out), self.schema)
        return self.write

    def write(self, make: Callable[[], pa.Table]) -> None:
        if self.csv:
            work = functools.partial(_csv_of, make)
        else:
            table = make()
            if not table.num_rows:
                return
            work = functools.partial(self.sink.write_table, table)  # type: ignore[attr-defined]
        self.pending.append(self.thread.submit(work))
        while len(self.pending) > self.AHEAD:
            self._done(self.pending.popleft())

    def _done(self, future: Future) -> None:
        formatted = future.result()
        if self.csv:
            self.sink.write(formatted)  # type: ignore[attr-defined]

    def __exit__(self, *exc) -> None:
        try:
            while self.pending:
                self._done(self.pending.popleft())
        finally:
            self.thread.shutdown()
            self.sink.close()  # type: ignore[attr-defined]


def _warm_arrow(parquet: bool) -> None:
    """Arrow imported, and its kernels built: the first of them that runs builds them all (0.2 s)."""
    import pyarrow as pa

    if parquet:
        import pyarrow.parquet
    table = pa.Table.from_arrays([texts(["x"]), numbers(np.array([0.5]))], names=["text", "number"])
    _csv(table.take(numbers(np.zeros(1, np.int64))))


def _csv_of(make: Callable[[], pa.Table]) -> pa.Buffer:
    return _csv(make())


def _csv(table: pa.Table, header: bool = False) -> pa.Buffer:
    """The table's rows as CSV (quoted where needed; rows formatted 8,192 at a time, ~20 % less CPU than Arrow's
    default 1,024), after a header line if asked (from its schema: an empty table gives the header alone)."""
    import pyarrow as pa
    import pyarrow.csv as csv

    # NOTE: a column with no value prints nothing whatever its type; Arrow prints a null string in a third of the
    # time of a null number, and most columns are empty in most chunks
    empty = [i for i, column in enumerate(table.columns) if column.null_count == len(column)]
    for i in empty:
        table = table.set_column(i, table.field(i).name, pa.nulls(table.num_rows, pa.string()))
    out = pa.BufferOutputStream()
    csv.write_csv(table, out, write_options=csv.WriteOptions(include_header=header, quoting_style="needed",
                                                             batch_size=8192))
    return out.getvalue()


def _schema(types: dict[str, str]) -> pa.Schema:
    import pyarrow as pa

    arrow = {"number": pa.float64(), "boolean": pa.bool_(), "text": pa.string()}
    base = [("kind", pa.string()), ("time", pa.float64()), ("timestamp", pa.timestamp("ms")),
            ("rank", pa.string()), ("line", pa.int64()), ("source", pa.int64()), ("text", pa.string())]
    return pa.schema(base + [(name, arrow[kind]) for name, kind in types.items() if name not in BASE])


def _hot_lines(directory: str, chunk: Chunk, scanned: ScannedChunk) -> JobResult:
    """The job of the read's workers: a chunk's hot batch, stats and access lines (`_HotLines`), stashed in
    `directory`: its path, and the lines left to the per-line parser (every other line, with the access lines
    whose fields or date the job cannot read)."""
    lines = scanned.access_lines
    read_access, access = access_fields(chunk.data, Words(chunk.data), lines, scanned.ends[lines.index])
    times, dated = stamp_times(lines.head)
    dated |= ~lines.timed
    taken = np.flatnonzero(read_access & dated)
    slow = np.ones(scanned.lines, bool)
    slow[scanned.batch.index] = False
    slow[scanned.stats.index] = False
    slow[lines.index[taken]] = False
    if not len(scanned.batch.index) and not len(scanned.stats.index) and not len(taken):
        return JobResult(None, slow)
    kept = np.flatnonzero(dated[read_access])  # the rows of `access` that are taken
    hot = _hot_rows(chunk, scanned, taken, times[taken], {name: column[..., kept] for name, column in access.items()})
    return JobResult(_stashed(directory, chunk, hot), slow)


@dataclass(slots=True)
class _HotLines:
    """A chunk's hot batch, stats and access lines as its scanner read them, rows in line order, all numpy: the
    read's workers never start Arrow, and no text is copied (each row's message is a span of the log's bytes,
    which the export reads again when it writes; a stream's chunk keeps a copy of those bytes in the stash)."""

    line: np.ndarray  # index in the chunk
    kind: np.ndarray  # code into _KINDS
    rank: np.ndarray  # code into `ranks`
    ranks: list[str]
    time: np.ndarray  # seconds on the log's clock; stats lines' before the clock's wraps (`_part_table` fixes them)
    timed: np.ndarray
    text: np.ndarray  # [begin, end) of each row's message, offsets in the chunk, shape (2, rows)
    fields: list[tuple[np.ndarray, dict[str, np.ndarray]]]  # (rows, {name: float64, NaN where absent}) per part
    access: tuple[np.ndarray, dict[str, np.ndarray]]  # (rows, `access_fields`'s columns of those rows)
    origin: tuple[str, int] = ("", 0)  # the file that holds the chunk's bytes, and the offset of its byte 0 there
    copied: bool = False  # `origin` is the stash's copy of a stream's chunk (removed once read)


def _hot_rows(chunk: Chunk, scanned: ScannedChunk, taken: np.ndarray, times: np.ndarray,
              access: dict[str, np.ndarray]) -> _HotLines:
    """The hot batch and stats lines and the hot access lines `taken` (indices into the scan's access lines,
    at `times`, with the fields `access`) as rows in line order."""
    batch, stats, lines = scanned.batch, scanned.stats, scanned.access_lines
    line = np.concatenate([batch.index, stats.index, lines.index[taken]])
    order = np.argsort(line, kind="stable")
    row = np.empty(len(order), np.int64)
    row[order] = np.arange(len(order))  # each line's row: batch lines first, then stats, then access
    first_stats, first_access = len(batch.index), len(batch.index) + len(stats.index)
    kind = np.concatenate([batch.kind, np.full(len(stats.index), _STATS, batch.kind.dtype),
                           np.full(len(taken), _ACCESS_CODE, batch.kind.dtype)])
    rank = np.concatenate([batch.rank, stats.rank + len(batch.ranks), lines.rank[taken]]).astype(np.int32)
    begin = np.concatenate([batch.label + 2, stats.message, lines.client[taken] - len(UVICORN_ACCESS)])
    return _HotLines(
        line=line[order], kind=kind[order], rank=rank[order], ranks=(batch.ranks + stats.ranks) or [""],
        time=np.concatenate([batch.time, stats.time, times])[order],
        timed=np.concatenate([np.ones(first_access, bool), lines.timed[taken]])[order],
        text=np.stack([begin[order], scanned.ends[line[order]]]),
        fields=[(row[:first_stats], batch.fields), (row[first_stats:first_access], stats.fields)],
        access=(row[first_access:], access))


def _stashed(directory: str, chunk: Chunk, hot: _HotLines) -> str:
    """`hot` pickled into a file in `directory`: its path. The chunk's bytes stay where they are when it is a
    range of a file; a stream's chunk's message bytes are copied into a file beside it (a newline after them,
    as in a log)."""
    if chunk.origin is not None:
        hot.origin = chunk.origin
    else:
        low, high = int(hot.text[0].min()), int(hot.text[1].max())
        handle, path = tempfile.mkstemp(suffix=".text", dir=directory)
        with os.fdopen(handle, "wb") as f:
            f.write(memoryview(chunk.data)[low: high])
            f.write(b"\n")
        hot.origin, hot.copied = (path, -low), True
    handle, path = tempfile.mkstemp(suffix=".hot", dir=directory)
    with os.fdopen(handle, "wb") as f:
        pickle.dump(hot, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _part_table(part: _Part, schema: pa.Schema) -> pa.Table:
    """A chunk's events in line order: its hot lines' table, less those the per-line parser took, and that
    parser's events."""
    import pyarrow.compute as pc

    slow = _events_table(_unspilled(part.events), schema) if part.events is not None else None
    if part.hot is None:
        return slow if slow is not None else empty_table(schema)
    with open(part.hot, "rb") as f:
        hot: _HotLines = pickle.load(f)  # NOTE: a file this process's read wrote in its own temporary directory
    os.unlink(part.hot)
    if part.stats_clock is not None:
        clock_lines, clock_times = part.stats_clock
        hot.time[np.searchsorted(hot.line, clock_lines)] = clock_times  # NOTE: every stats line has its row
    table = _hot_table(hot, schema, part.first, part.source)
    if part.routed:
        routed = numbers(np.asarray(part.routed, np.int64) + part.first)
        table = table.filter(pc.invert(pc.is_in(table.column("line"), routed)))
    return table if slow is None else _merged(table, slow)


def _hot_table(hot: _HotLines, schema: pa.Schema, first: int, source: int) -> pa.Table:
    """The rows of `hot` as a table of the export's columns (lines numbered from `first`, in log `source`)."""
    import pyarrow as pa

    n = len(hot.line)
    data, low = _text(hot)
    untimed = ~hot.timed
    columns = {
        "kind": names(hot.kind, list(_KINDS)), "time": numbers(hot.time, missing=untimed),
        "timestamp": numbers(np.round(np.where(untimed, 0, hot.time) * 1000).astype(np.int64), pa.timestamp("ms"),
                             untimed),
        "rank": names(hot.rank, hot.ranks), "line": numbers((hot.line + first).astype(np.int64)),
        "source": numbers(np.full(n, source, np.int64)), "text": spans(data, hot.text[0] - low, hot.text[1] - low),
    }
    values: dict[str, np.ndarray] = {}
    for rows, fields in hot.fields:
        for name, column in fields.items():
            if name not in BASE:
                values.setdefault(name, np.full(n, np.nan))[rows] = column
    access_rows, access = hot.access
    arrays = []
    for f in schema:
        if f.name in columns:
            arrays.append(columns[f.name])
        elif f.name in values:
            arrays.append(_batch_field(values[f.name], f.type))
        elif f.name in access and len(access_rows):
            arrays.append(_access_field(access[f.name], access_rows, n, data, low).cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _text(hot: _HotLines) -> tuple[bytes, int]:
    """(the bytes of the log that hold the rows' messages, the offset in the chunk of the first); raises
    ValueError where the file no longer holds them (each message must still end a line)."""
    low, high = int(hot.text[0].min()), int(hot.text[1].max())
    path, offset = hot.origin
    with open(path, "rb", buffering=0) as f:
        data = _pread(f.fileno(), high - low + 1, offset + low)
    if hot.copied:
        os.unlink(path)
    ends = hot.text[1] - low
    if len(data) < high - low or not (np.frombuffer(data, np.uint8)[np.minimum(ends, len(data) - 1)] == 10)[
            ends < len(data)].all():
        raise ValueError(f"{path} changed while it was read")
    return data, low


def _pread(fd: int, size: int, offset: int) -> bytes:
    """`size` bytes of the file at `offset`, fewer only at its end (a read may return less: a network file)."""
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _access_field(column: np.ndarray, rows: np.ndarray, n: int, data: bytes, low: int) -> pa.Array:
    """An access field's column over all `n` rows (null but on the access `rows`): spans of `data` as text, or
    numbers."""
    if column.ndim == 2:
        return spans(data, column[0] - low, column[1] - low, rows, n)
    placed = np.zeros(n, column.dtype)
    placed[rows] = column
    missing = np.ones(n, bool)
    missing[rows] = False
    return numbers(placed, missing=missing)


def _unspilled(path: str) -> list[Event]:
    with open(path, "rb") as f:
        events = pickle.load(f)  # NOTE: a file this process wrote in its own temporary directory
    os.unlink(path)
    return events


def _batch_field(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    missing = np.isnan(values)
    if kind == pa.bool_():
        return booleans(values == 1.0, missing)
    if kind == pa.string():
        return texts([None if m else str(int(v) if v == int(v) else v)
                      for v, m in zip(values.tolist(), missing.tolist())])
    return numbers(values, missing=missing)


_MAX_SLICES = 32  # more slices than this make the writers slow (a record batch each): the rows are copied instead


def _merged(hot: pa.Table, slow: pa.Table) -> pa.Table:
    """Two tables in line order (no line in both) as one in line order: slices of each where the slow rows come
    in a few runs, else a copy in order."""
    import pyarrow as pa

    lines, slow_lines = values_of(hot.column("line"), np.int64), values_of(slow.column("line"), np.int64)
    at = np.searchsorted(lines, slow_lines)  # where each slow row goes among the hot ones
    starts = np.flatnonzero(np.diff(at, prepend=-1))  # the first slow row of each run that goes to one place
    if len(starts) > _MAX_SLICES:
        order = np.argsort(np.concatenate([lines, slow_lines]), kind="stable")
        return pa.concat_tables([hot, slow]).take(numbers(order))
    parts = []
    done = 0
    for first, end in zip(starts.tolist(), [*starts[1:].tolist(), len(at)]):
        where = int(at[first])
        if where > done:
            parts.append(hot.slice(done, where - done))
            done = where
        parts.append(slow.slice(first, end - first))
    parts.append(hot.slice(done))
    return pa.concat_tables(parts)


def _events_table(events: list[Event], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    events = sorted(events, key=attrgetter("line"))
    n = len(events)
    kinds = {name: schema.field(name).type for name in schema.names[len(BASE):]}
    fields: dict[str, list] = {}
    for i, e in enumerate(events):
        for name, value in parse_fields(e.kind, e.text).items():
            kind = kinds.get(name)
            if kind is not None:
                column = fields.get(name)
                if column is None:
                    column = fields[name] = [None] * n
                column[i] = _cell(value, kind)
    untimed = np.fromiter((e.time is None for e in events), bool, n)
    times = np.fromiter((0.0 if e.time is None else e.time for e in events), np.float64, n)
    columns = {"kind": texts([e.kind for e in events]), "time": numbers(times, missing=untimed),
               "timestamp": numbers(np.round(times * 1000).astype(np.int64), pa.timestamp("ms"), untimed),
               "rank": texts([e.rank for e in events]),
               "line": numbers(np.fromiter((e.line for e in events), np.int64, n)),
               "source": numbers(np.fromiter((e.source for e in events), np.int64, n)),
               "text": texts([e.text for e in events])}
    columns.update((name, _event_field(fields.get(name), kind, n)) for name, kind in kinds.items())
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _event_field(values: list | None, kind: pa.DataType, n: int) -> pa.Array:
    """A field's column of `n` events (`_cell`'s values, None where absent; no list: absent from every one)."""
    import pyarrow as pa

    if values is None:
        return pa.nulls(n, kind)
    if kind == pa.string():
        return texts(values)
    missing = np.fromiter((v is None for v in values), bool, n)
    if kind == pa.bool_():
        return booleans(np.fromiter((v is True for v in values), bool, n), missing)
    return numbers(np.fromiter((np.nan if v is None else v for v in values), np.float64, n), missing=missing)


def _cell(value: object, kind: pa.DataType) -> object:
    import pyarrow as pa

    if kind == pa.string():
        return None if value is None else str(value)
    if kind == pa.bool_():
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None
