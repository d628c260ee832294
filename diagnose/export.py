"""`--export events.csv|events.parquet`: every event of the logs, one row each, streamed out chunk by chunk.

Columns: kind, time, timestamp, rank, line, source, text, then every field (absent fields empty). The logs are
read a second time, so memory stays flat: a chunk's hot batch lines keep the fast path's columns and their
text as Arrow strings, every other event is read by the per-line parser. The column set (and each field's
type: number, boolean or text) comes from the analysis of the same logs.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.diagnose.events import Event
from toolkit.diagnose.fastpath.ahead import ReadChunk, runs, scanned_chunks
from toolkit.diagnose.fastpath.fields import BOOLEAN
from toolkit.diagnose.fastpath.scan import DECODE, ScannedChunk
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.lines import LineParser, ParseStats
from toolkit.diagnose.series import META
from toolkit.diagnose.source import Chunk, LineReader, decode_lines, open_log

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
    def __init__(self, out: Path, schema: pa.Schema) -> None:
        self.out, self.schema, self.sink = out, schema, None

    def __enter__(self):
        import pyarrow.csv as csv
        import pyarrow.parquet as pq

        if self.out.suffix == ".csv":
            self.sink = csv.CSVWriter(str(self.out), self.schema,
                                      write_options=csv.WriteOptions(quoting_style="needed"))
        else:
            self.sink = pq.ParquetWriter(str(self.out), self.schema)
        return lambda table: self.sink.write_table(table) if table.num_rows or self.out.suffix == ".csv" else None

    def __exit__(self, *exc) -> None:
        self.sink.close()


def _schema(types: dict[str, str]) -> pa.Schema:
    import pyarrow as pa

    arrow = {"number": pa.float64(), "boolean": pa.bool_(), "text": pa.string()}
    base = [("kind", pa.string()), ("time", pa.float64()), ("timestamp", pa.timestamp("ms")),
            ("rank", pa.string()), ("line", pa.int64()), ("source", pa.int64()), ("text", pa.string())]
    return pa.schema(base + [(name, arrow[kind]) for name, kind in types.items() if name not in BASE])


def _tables(path: str | Path, source: int, schema: pa.Schema):
    """One Arrow table per chunk: its events in line order."""
    parser = LineParser(source, ParseStats())
    with open_log(path) as stream:
        no = 1
        for read in scanned_chunks(LineReader(stream).chunks()):
            chunk, scanned = read.raw  # type: ignore[misc]
            events, hot = _chunk_events(read, no, parser)
            no += scanned.lines
            yield _table(events, hot, chunk, scanned, source, schema)
    tail = parser.finish()
    if tail:
        yield _table(tail, None, None, None, source, schema)


def _chunk_events(read: ReadChunk, first: int, parser: LineParser):
    """(events the per-line parser read, (hot batch rows kept, first line)) of one chunk. Access lines,
    which the scanner only counts, go to the per-line parser here for their fields."""
    slow = np.ones(read.lines, bool)
    slow[read.batch.index] = False
    events: list[Event] = []
    routed: list[int] = []
    for begin, end, is_slow in runs(slow):
        if is_slow:
            events += parser.feed(read.texts(begin, end), first + begin)
            continue
        if parser.open_record:
            events += parser.feed(read.texts(begin, begin + 1), first + begin)
            routed.append(begin)
        parser.stamped = True
    keep = ~np.isin(read.batch.index, routed) if routed else np.ones(len(read.batch.index), bool)
    return events, (keep, first)


def _table(events: list[Event], hot, chunk: Chunk | None, scanned: ScannedChunk | None, source: int,
           schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    parts = []
    if events:
        parts.append(_events_table(events, schema))
    if hot is not None and scanned is not None and chunk is not None:
        keep, first = hot
        if keep.any():
            parts.append(_hot_table(chunk, scanned, keep, first, source, schema))
    if not parts:
        return pa.Table.from_pylist([], schema=schema)
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    order = np.argsort(table.column("line").to_numpy(), kind="stable")
    return table.take(pa.array(order))


def _events_table(events: list[Event], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    names = set(schema.names)
    records = []
    for e in sorted(events, key=lambda e: e.line):
        record = {"kind": e.kind, "time": e.time, "timestamp": None if e.time is None else int(e.time * 1000),
                  "rank": e.rank, "line": e.line, "source": e.source, "text": e.text}
        for name, value in parse_fields(e.kind, e.text).items():
            if name in names and name not in record:
                record[name] = _cell(value, schema.field(name).type)
        records.append(record)
    return pa.Table.from_pylist(records, schema=schema)


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


def _hot_table(chunk: Chunk, scanned: ScannedChunk, keep: np.ndarray, first: int, source: int,
               schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    batch = scanned.batch
    index = batch.index[keep]
    n = len(index)
    ranks = np.array(batch.ranks or [""], dtype=object)[batch.rank[keep]]
    kinds = np.where(batch.kind[keep] == DECODE, "decode", "prefill").astype(object)
    time = batch.time[keep]
    columns = {
        "kind": pa.array(kinds, pa.string()), "time": pa.array(time),
        "timestamp": pa.array((time * 1000).astype(np.int64), pa.timestamp("ms")),
        "rank": pa.array(ranks, pa.string()), "line": pa.array(index + first),
        "source": pa.array(np.full(n, source, np.int64)),
        "text": _messages(chunk, scanned.starts[index], scanned.ends[index]),
    }
    for name in schema.names[len(BASE):]:
        values = batch.fields.get(name)
        kind = schema.field(name).type
        if values is None:
            columns[name] = pa.nulls(n, kind)
            continue
        values = values[keep]
        missing = np.isnan(values)
        if kind == pa.bool_():
            columns[name] = pa.array(values == 1.0, pa.bool_(), mask=missing)
        elif kind == pa.string():
            columns[name] = pa.array([None if m else str(int(v) if v == int(v) else v)
                                      for v, m in zip(values.tolist(), missing.tolist())], pa.string())
        else:
            columns[name] = pa.array(values, pa.float64(), mask=missing)
    return pa.Table.from_pydict(columns, schema=schema)


def _messages(chunk: Chunk, starts: np.ndarray, ends: np.ndarray):
    """The message text of hot lines (from their label, after the stamp tag) as an Arrow string array."""
    import pyarrow as pa

    data = np.frombuffer(chunk.data, np.uint8)
    close = np.array([chunk.data.find(b"] ", s, e) + 2 for s, e in zip(starts.tolist(), ends.tolist())], np.int64)
    lengths = ends - close
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    index = np.repeat(close - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(data[index].tobytes()))
