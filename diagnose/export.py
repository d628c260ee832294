"""`--export events.csv|events.parquet`: every event of the logs, one row each, streamed out chunk by chunk.

Columns: kind, time, timestamp, rank, line, source, text, then every field (absent fields empty). The logs are
read a second time, so memory stays flat: a chunk's hot batch lines keep the fast path's columns and their
text as Arrow strings, every other event is read by the per-line parser. The column set (and each field's
type: number, boolean or text) comes from the analysis of the same logs.
"""
from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.diagnose.events import Event
from toolkit.diagnose.fastpath.access import access_fields, strings
from toolkit.diagnose.fastpath.ahead import (JobResult, LineTooLong, ReadChunk, scanned_chunks, scanned_ranges,
                                              use_processes)
from toolkit.diagnose.fastpath.fields import BOOLEAN
from toolkit.diagnose.fastpath.scan import DECODE, ScannedChunk, stamp_times
from toolkit.diagnose.fastpath.words import Words
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.lines import LineParser, ParseStats
from toolkit.diagnose.reading import chunk_size, read_chunk_lines
from toolkit.diagnose.series import META
from toolkit.diagnose.source import Chunk, LineReader, open_log

if TYPE_CHECKING:
    import pyarrow as pa

    from toolkit.diagnose.analysis import Diagnosis

FORMATS = (".csv", ".parquet")
BASE = ("kind", "time", "timestamp", "rank", "line", "source", "text")
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


def write_events(paths: Sequence[str | Path], out: str | Path, d: Diagnosis) -> Path:
    """Write the events of `paths` to `.csv` or `.parquet` (chosen by the suffix); raises ValueError otherwise."""
    import pyarrow as pa

    out = Path(out)
    if out.suffix not in FORMATS:
        raise ValueError(f"--export needs a .csv or .parquet file name, not {out.name!r}")
    schema = _schema(field_types(d))
    with _writer(out, schema) as write:
        for source, path in enumerate(paths):
            for table in _tables(path, source, schema):
                write(table)
        if not paths:
            write(pa.Table.from_pylist([], schema=schema))
    return out


class _writer:
    """The CSV or Parquet sink, written on a thread of its own (Arrow's writers release the GIL): the caller
    builds the next chunk's table meanwhile. At most `AHEAD` tables wait to be written."""

    AHEAD = 2

    def __init__(self, out: Path, schema: pa.Schema) -> None:
        self.out, self.schema, self.sink = out, schema, None
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="diagnose-export")
        self.pending: deque[Future] = deque()

    def __enter__(self) -> Callable[[pa.Table], None]:
        import pyarrow.csv as csv
        import pyarrow.parquet as pq

        if self.out.suffix == ".csv":
            # NOTE: rows are formatted 8,192 at a time (Arrow's default 1,024): ~20 % less CPU, the same bytes
            self.sink = csv.CSVWriter(str(self.out), self.schema,
                                      write_options=csv.WriteOptions(quoting_style="needed", batch_size=8192))
        else:
            self.sink = pq.ParquetWriter(str(self.out), self.schema)
        return self.write

    def write(self, table: pa.Table) -> None:
        if not table.num_rows and self.out.suffix != ".csv":
            return
        self.pending.append(self.thread.submit(self.sink.write_table, table))  # type: ignore[union-attr]
        while len(self.pending) > self.AHEAD:
            self.pending.popleft().result()

    def __exit__(self, *exc) -> None:
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.thread.shutdown()
            self.sink.close()  # type: ignore[union-attr]


def _schema(types: dict[str, str]) -> pa.Schema:
    import pyarrow as pa

    arrow = {"number": pa.float64(), "boolean": pa.bool_(), "text": pa.string()}
    base = [("kind", pa.string()), ("time", pa.float64()), ("timestamp", pa.timestamp("ms")),
            ("rank", pa.string()), ("line", pa.int64()), ("source", pa.int64()), ("text", pa.string())]
    return pa.schema(base + [(name, arrow[kind]) for name, kind in types.items() if name not in BASE])


def _tables(path: str | Path, source: int, schema: pa.Schema):
    """One Arrow table per chunk: its events in line order. A large plain file is read by worker processes
    (as the analysis reads it), which also build the tables of its hot lines."""
    parser = LineParser(source, ParseStats())
    job = functools.partial(_hot_lines, schema)
    no, offset = 1, 0
    if use_processes(path):
        try:
            for read in scanned_ranges(path, chunk_size(), job=job):
                yield _chunk_table(read, no, parser, schema)
                no += read.lines
            offset = -1
        except LineTooLong as too_long:
            offset = too_long.offset
    if offset >= 0:
        with open_log(path) as stream:
            if offset:
                stream.seek(offset)
            for read in scanned_chunks(LineReader(stream).chunks(), job=job):
                yield _chunk_table(read, no, parser, schema)
                no += read.lines
    tail = parser.finish()
    if tail:
        yield _events_table(tail, schema)


@dataclass(slots=True)
class _Hot:
    """A chunk's hot lines for the export, in line order (numbers counted from 0 in the chunk): the columns in
    which some line has a value. The caller adds the others as nulls: sent, a column of nulls costs as much as
    one of values (its offsets and validity), and most of the schema's columns are null on a hot line."""

    rows: int
    columns: dict[str, pa.Array]

    def table(self, schema: pa.Schema) -> pa.Table:
        import pyarrow as pa

        arrays = [self.columns[f.name] if f.name in self.columns else pa.nulls(self.rows, f.type) for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)


def _hot_lines(schema: pa.Schema, chunk: Chunk, scanned: ScannedChunk) -> JobResult:
    """The table of a chunk's hot batch and access lines; every other line is the per-line parser's."""
    import pyarrow as pa

    words = Words(chunk.data)
    lines = scanned.access_lines
    read_access, access = access_fields(chunk.data, words, lines, scanned.ends[lines.index])
    times, dated = stamp_times(lines.head)
    dated |= ~lines.timed
    taken = np.flatnonzero(read_access & dated)
    kept = np.flatnonzero(dated[read_access])
    access = {name: column.take(pa.array(kept)) if isinstance(column, pa.Array) else column[kept]
              for name, column in access.items()}
    slow = np.ones(scanned.lines, bool)
    slow[scanned.batch.index] = False
    slow[lines.index[taken]] = False
    parts = []
    if len(scanned.batch.index):
        parts.append(_hot_columns(chunk, scanned, schema))
    if len(taken):
        parts.append(_access_columns(chunk, scanned, taken, access, times, schema))
    return JobResult(_in_line_order(parts, schema) if parts else None, slow)


def _in_line_order(parts: list[dict[str, pa.Array]], schema: pa.Schema) -> _Hot:
    """The parts' rows as one set of columns in line order (a column some part lacks is null there)."""
    import pyarrow as pa

    sizes = [len(part["line"]) for part in parts]
    names = [name for name in schema.names if any(name in part for part in parts)]
    columns = {name: pa.concat_arrays([part[name] if name in part else pa.nulls(n, schema.field(name).type)
                                       for part, n in zip(parts, sizes)]) for name in names}
    order = np.argsort(columns["line"].to_numpy(), kind="stable")
    if not bool((order[1:] > order[:-1]).all()):
        columns = {name: column.take(pa.array(order)) for name, column in columns.items()}
    return _Hot(sum(sizes), columns)


def _chunk_table(read: ReadChunk, first: int, parser: LineParser, schema: pa.Schema) -> pa.Table:
    """A chunk's events in line order: its hot lines' table, the rest from the per-line parser."""
    import pyarrow as pa
    import pyarrow.compute as pc

    events, routed = read_chunk_lines(parser, read, first)
    slow = _events_table(events, schema) if events else None
    if read.extra is None:
        return slow if slow is not None else pa.Table.from_pylist([], schema=schema)
    hot = read.extra.table(schema)  # type: ignore[attr-defined]
    if routed:
        hot = hot.filter(pc.invert(pc.is_in(hot.column("line"), pa.array(routed, pa.int64()))))
    hot = hot.set_column(schema.get_field_index("line"), "line", pc.add(hot.column("line"), first))
    hot = hot.set_column(schema.get_field_index("source"), "source",
                         pa.array(np.full(hot.num_rows, parser.source, np.int64)))
    return hot if slow is None else _merged(hot, slow)


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


def _access_columns(chunk: Chunk, scanned: ScannedChunk, taken: np.ndarray, access: dict, times: np.ndarray,
                    schema: pa.Schema) -> dict[str, pa.Array]:
    """Hot access lines `taken` (indices into the scan's access lines), with `access`, their fields as read: the
    columns with a value."""
    import pyarrow as pa

    lines = scanned.access_lines
    rows = taken
    index = lines.index[rows]
    n = len(rows)
    time = times[rows]
    untimed = ~lines.timed[rows]
    ranks = _names(lines.rank[rows], scanned.batch.ranks or [""])
    columns = {
        "kind": _names(np.zeros(n, np.int8), ["access"]), "time": pa.array(time, mask=untimed),
        "timestamp": pa.array(np.round(np.where(untimed, 0, time) * 1000).astype(np.int64), pa.timestamp("ms"),
                              mask=untimed),
        "rank": ranks, "line": pa.array(index.astype(np.int64)),
        "source": pa.array(np.zeros(n, np.int64)),
        "text": strings(chunk.data, lines.client[rows] - len("INFO:     "), scanned.ends[index]),
    }
    for name in schema.names[len(BASE):]:
        column = access.get(name)
        if column is not None:
            columns[name] = (column if isinstance(column, pa.Array) else pa.array(column)).cast(schema.field(name).type)
    return _with_values(columns)


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


def _hot_columns(chunk: Chunk, scanned: ScannedChunk, schema: pa.Schema) -> dict[str, pa.Array]:
    """A chunk's hot batch lines (line numbers counted from 0 in the chunk): the columns with a value."""
    import pyarrow as pa

    batch = scanned.batch
    index = batch.index
    n = len(index)
    ranks = _names(batch.rank, batch.ranks or [""])
    kinds = _names(batch.kind, ["decode", "prefill"])
    time = batch.time
    columns = {
        "kind": kinds, "time": pa.array(time),
        "timestamp": pa.array(np.round(time * 1000).astype(np.int64), pa.timestamp("ms")),
        "rank": ranks, "line": pa.array(index.astype(np.int64)),
        "source": pa.array(np.zeros(n, np.int64)),
        "text": strings(chunk.data, batch.label + 2, scanned.ends[index]),
    }
    for name in schema.names[len(BASE):]:
        values = batch.fields.get(name)
        kind = schema.field(name).type
        if values is None:
            continue
        missing = np.isnan(values)
        if kind == pa.bool_():
            columns[name] = pa.array(values == 1.0, pa.bool_(), mask=missing)
        elif kind == pa.string():
            columns[name] = pa.array([None if m else str(int(v) if v == int(v) else v)
                                      for v, m in zip(values.tolist(), missing.tolist())], pa.string())
        else:
            columns[name] = pa.array(values, pa.float64(), mask=missing)
    return _with_values(columns)


def _with_values(columns: dict[str, pa.Array]) -> dict[str, pa.Array]:
    return {name: column for name, column in columns.items() if column.null_count < len(column)}


def _names(codes: np.ndarray, names: list[str]):
    """An Arrow string array of `names[code]` (numpy object arrays would make pyarrow import pandas)."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(names, pa.string())).cast(pa.string())
