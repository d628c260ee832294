"""`--export events.csv|events.parquet`: every event of the logs, one row each, from the analysis's own read.

Columns: kind, time, timestamp, rank, line, source, text, then every field (absent fields empty). The column set
(and each field's type: number, boolean or text) comes from the analysis, so the rows wait for it: while the
logs are read, an `EventStash` keeps each chunk's hot batch, stats and access lines as the worker that scanned it
wrote them (an Arrow file in a temporary directory beside the output, their text as Arrow strings) and the per-line
parser's events of the chunk; then each chunk's rows are made in line order and written, CSV formatted on
`FORMATTERS` threads at once (Arrow's writers release the GIL). The stash takes about as much disk as the CSV
(239 MB for the 1M-line benchmark log's 234 MB), each file removed once written, the directory when done.
"""
from __future__ import annotations

import functools
import os
import pickle
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Self

import numpy as np

from toolkit.diagnose.events import Event
from toolkit.diagnose.fastpath.access import access_fields, strings
from toolkit.diagnose.fastpath.ahead import JobResult, ReadChunk
from toolkit.diagnose.fastpath.fields import BOOLEAN
from toolkit.diagnose.fastpath.scan import ACCESS, ScannedChunk, stamp_times
from toolkit.diagnose.fastpath.words import Words
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.series import META
from toolkit.diagnose.source import Chunk

if TYPE_CHECKING:
    import pyarrow as pa

    from toolkit.diagnose.analysis import Diagnosis

FORMATS = (".csv", ".parquet")
BASE = ("kind", "time", "timestamp", "rank", "line", "source", "text")
FORMATTERS = 2  # threads formatting CSV: the read's workers are done by then
_KINDS = ("decode", "prefill", "access", "stats")  # a hot row's kind by code: the scan's, then stats
_ACCESS_CODE, _STATS = _KINDS.index("access"), _KINDS.index("stats")
assert _KINDS[_ACCESS_CODE] == "access" and _ACCESS_CODE == ACCESS, "the scan's kind codes"
_DERIVED = frozenset({"usage", "hit_rate", "phase", "after_idle"})
_ACCESS = {"client": "text", "method": "text", "path": "text", "status": "number"}


def field_types(d: Diagnosis) -> dict[str, str]:
    """{field: "number" | "boolean" | "text"} of every field the analysed logs' events have."""
    types: dict[str, str] = {}
    for table in d.timeline.batches.values():
        for name in table.columns:
            if name not in META and name not in _DERIVED:
                types[name] = "boolean" if name in BOOLEAN else "number"
    for events in d.timeline.events.values():
        for e in events:
            for name, value in e.fields.items():
                types[name] = _merge(types.get(name), _type(value))
    if d.stats.kinds.get("access"):
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
    """One chunk as read: its source and first line number, the Arrow file of its hot lines (None: none), the
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
    """What `--export` keeps of the analysis's read until the analysis says which columns the file has: the
    `tap` of `read_logs` (each chunk's events and hot lines' file) and the `job` its workers run. A context
    manager: its temporary directory (beside the output, so it is on the same disk) goes when it closes."""

    def __init__(self, out: str | Path) -> None:
        # NOTE: imported once here: the read's workers are forked after it
        import pyarrow.compute
        import pyarrow.csv  # noqa: F401

        self.out = check_export_path(out)
        if not self.out.parent.is_dir():
            raise ValueError(f"no such directory: {self.out.parent}")
        try:
            self.directory = tempfile.mkdtemp(prefix=".toolkit-export-", dir=self.out.parent)
        except OSError as exc:
            raise OSError(f"cannot write in {self.out.parent}: {exc.strerror}") from exc
        self.job = functools.partial(_hot_lines, self.directory)
        self.parts: list[_Part] = []

    def chunk(self, source: int, first: int, read: ReadChunk, events: list[Event], routed: list[int]) -> None:
        stats = (read.columns or {}).get("stats")
        clock = (stats["line"], stats["time"]) if stats is not None else None
        extra: str | None = read.extra  # type: ignore[assignment]  # NOTE: the path `_hot_lines` wrote, or None
        self.parts.append(_Part(source, first, extra, self._spilled(events), routed, clock))

    def tail(self, source: int, events: list[Event]) -> None:
        if events:
            self.parts.append(_Part(source, 0, None, self._spilled(events)))

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
        shutil.rmtree(self.directory, ignore_errors=True)


def export_events(paths: Sequence[str | Path], out: str | Path, **analysis) -> tuple[Diagnosis, Path]:
    """Analyse `paths` (with `analysis`'s keywords of `analyze`) and write their events to `out` (`.csv` or
    `.parquet`), in one read."""
    from toolkit.diagnose.analysis import analyze

    with EventStash(out) as stash:
        d = analyze(paths, tap=stash, **analysis)
        return d, write_events(stash, d)


def write_events(stash: EventStash, d: Diagnosis) -> Path:
    """Write the events `stash` kept of the read `d` analysed to its output (chosen by the suffix)."""
    schema = _schema(field_types(d))
    with _writer(stash.out, schema) as write:
        for part in stash.parts:
            write(functools.partial(_part_table, part, schema))
        if not stash.parts:
            write(schema.empty_table)
    return stash.out


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
            self.sink.write(_csv(self.schema.empty_table(), header=True))  # type: ignore[attr-defined]
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
    """The job of the read's workers: a chunk's hot batch, stats and access lines as one table in line order
    (lines numbered from 0 in the chunk; each batch or stats field a float64 column as read, NaN where a line
    lacks it; the access fields as read), written to an Arrow file in `directory`: its path, and the lines left
    to the per-line parser (every other line, with the access lines whose fields or date the job cannot read)."""
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
    return JobResult(_stashed(directory, _hot_table(chunk, scanned, taken, times, access, kept)), slow)


def _hot_table(chunk: Chunk, scanned: ScannedChunk, taken: np.ndarray, times: np.ndarray, access: dict,
               kept: np.ndarray) -> dict[str, pa.Array]:
    """The columns with a value of the hot batch and stats lines and the hot access lines `taken` (indices into
    the scan's access lines, their times `times[taken]`, their fields the rows `kept` of `access`), rows in line
    order: each column built in that order at once (the text copied out of the chunk once). The stats lines'
    times are before the clock's wraps: `_part_table` puts them on the reader's clock."""
    import pyarrow as pa

    batch, stats, lines = scanned.batch, scanned.stats, scanned.access_lines
    hot = len(batch.index) + len(stats.index)
    line = np.concatenate([batch.index, stats.index, lines.index[taken]])
    order = np.argsort(line, kind="stable")
    line = line[order]
    of_access = order >= hot
    untimed = np.concatenate([np.zeros(hot, bool), ~lines.timed[taken]])[order]
    time = np.concatenate([batch.time, stats.time, times[taken]])[order]
    begin = np.concatenate([batch.label + 2, stats.message, lines.client[taken] - len("INFO:     ")])[order]
    kind = np.concatenate([batch.kind, np.full(len(stats.index), _STATS, batch.kind.dtype),
                           np.full(len(taken), _ACCESS_CODE, batch.kind.dtype)])
    ranks = batch.ranks + stats.ranks
    rank = np.concatenate([batch.rank, stats.rank + len(batch.ranks), lines.rank[taken]])
    columns = {
        "kind": _names(kind[order], list(_KINDS)),
        "time": pa.array(time, mask=untimed),
        "timestamp": pa.array(np.round(np.where(untimed, 0, time) * 1000).astype(np.int64), pa.timestamp("ms"),
                              mask=untimed),
        "rank": _names(rank[order], ranks or [""]),
        "line": pa.array(line.astype(np.int64)), "source": pa.array(np.zeros(len(line), np.int64)),
        "text": strings(chunk.data, begin, scanned.ends[line]),
    }
    blank_batch, blank_stats, blank_access = (np.full(n, np.nan) for n in (len(batch.index), len(stats.index),
                                                                           len(taken)))
    for name in dict.fromkeys([*batch.fields, *stats.fields]):
        parts = [batch.fields.get(name, blank_batch), stats.fields.get(name, blank_stats), blank_access]
        values = np.concatenate(parts)[order]
        if name not in BASE and not np.isnan(values).all():
            columns[name] = pa.array(values, pa.float64())
    at = np.where(of_access, order - hot, 0)  # each row's place among the access rows (0 on batch rows)
    for name, column in access.items():
        column = column.take(pa.array(kept)) if isinstance(column, pa.Array) else pa.array(column[kept])
        columns[name] = column.take(pa.array(at, mask=~of_access))
    return _with_values(columns)


def _stashed(directory: str, columns: dict[str, pa.Array]) -> str:
    """`columns` written as an Arrow file in `directory`; its path."""
    import pyarrow as pa

    table = pa.table(columns)
    handle, path = tempfile.mkstemp(suffix=".arrow", dir=directory)
    with os.fdopen(handle, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
    return path


def _part_table(part: _Part, schema: pa.Schema) -> pa.Table:
    """A chunk's events in line order: its hot lines' table, less those the per-line parser took, and that
    parser's events."""
    import pyarrow as pa
    import pyarrow.compute as pc

    slow = _events_table(_unspilled(part.events), schema) if part.events is not None else None
    if part.hot is None:
        return slow if slow is not None else schema.empty_table()
    with pa.memory_map(part.hot) as source:
        hot = _conformed(pa.ipc.open_file(source).read_all(), schema)
    os.unlink(part.hot)
    if part.stats_clock is not None:
        hot = _on_clock(hot, schema, *part.stats_clock)
    if part.routed:
        hot = hot.filter(pc.invert(pc.is_in(hot.column("line"), pa.array(part.routed, pa.int64()))))
    hot = hot.set_column(schema.get_field_index("line"), "line", pc.add(hot.column("line"), part.first))
    hot = hot.set_column(schema.get_field_index("source"), "source",
                         pa.array(np.full(hot.num_rows, part.source, np.int64)))
    return hot if slow is None else _merged(hot, slow)


def _on_clock(hot: pa.Table, schema: pa.Schema, lines: np.ndarray, times: np.ndarray) -> pa.Table:
    """The hot table with its stats rows' times (and timestamps) those the reader put on the log's clock (the
    rows of `lines`, numbered in the chunk, at `times`)."""
    import pyarrow as pa

    time = hot.column("time").to_numpy(zero_copy_only=False).copy()
    at = np.searchsorted(hot.column("line").to_numpy(), lines)  # NOTE: every stats line has its hot row
    time[at] = times
    missing = hot.column("time").is_null().to_numpy(zero_copy_only=False)
    hot = hot.set_column(schema.get_field_index("time"), "time", pa.array(time, mask=missing))
    stamp = np.round(np.where(missing, 0, time) * 1000).astype(np.int64)
    return hot.set_column(schema.get_field_index("timestamp"), "timestamp",
                          pa.array(stamp, pa.timestamp("ms"), mask=missing))


def _unspilled(path: str) -> list[Event]:
    with open(path, "rb") as f:
        events = pickle.load(f)  # NOTE: a file this process wrote in its own temporary directory
    os.unlink(path)
    return events


def _conformed(hot: pa.Table, schema: pa.Schema) -> pa.Table:
    """A job's table with the export's columns: each batch field (float64, NaN where absent) in its column's type
    (a boolean is 1; a number in a text column is printed as an int where it is one), the access fields cast,
    nulls where the table has no such column."""
    import pyarrow as pa

    arrays = []
    for f in schema:
        if f.name not in hot.column_names:
            arrays.append(pa.nulls(hot.num_rows, f.type))
        elif f.name in BASE or f.name in _ACCESS:
            arrays.append(hot.column(f.name).cast(f.type))
        else:
            arrays.append(_batch_field(hot.column(f.name).to_numpy(), f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _batch_field(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    missing = np.isnan(values)
    if kind == pa.bool_():
        return pa.array(values == 1.0, pa.bool_(), mask=missing)
    if kind == pa.string():
        return pa.array([None if m else str(int(v) if v == int(v) else v)
                         for v, m in zip(values.tolist(), missing.tolist())], pa.string())
    return pa.array(values, pa.float64(), mask=missing)


_MAX_SLICES = 32  # more slices than this make the writers slow (a record batch each): the rows are copied instead


def _merged(hot: pa.Table, slow: pa.Table) -> pa.Table:
    """Two tables in line order (no line in both) as one in line order: slices of each where the slow rows come
    in a few runs, else a copy in order."""
    import pyarrow as pa

    lines, slow_lines = hot.column("line").to_numpy(), slow.column("line").to_numpy()
    at = np.searchsorted(lines, slow_lines)  # where each slow row goes among the hot ones
    starts = np.flatnonzero(np.diff(at, prepend=-1))  # the first slow row of each run that goes to one place
    if len(starts) > _MAX_SLICES:
        order = np.argsort(np.concatenate([lines, slow_lines]), kind="stable")
        return pa.concat_tables([hot, slow]).take(pa.array(order))
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
    times = [e.time for e in events]
    columns = {"kind": [e.kind for e in events], "time": times,
               "timestamp": [None if t is None else round(t * 1000) for t in times], "rank": [e.rank for e in events],
               "line": [e.line for e in events], "source": [e.source for e in events], "text": [e.text for e in events]}
    columns.update((name, fields.get(name, [None] * n)) for name in kinds)
    return pa.Table.from_pydict(columns, schema=schema)


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


def _with_values(columns: dict[str, pa.Array]) -> dict[str, pa.Array]:
    return {name: column for name, column in columns.items() if column.null_count < len(column)}


def _names(codes: np.ndarray, names: list[str]):
    """An Arrow string array of `names[code]` (numpy object arrays would make pyarrow import pandas)."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(names, pa.string())).cast(pa.string())
