"""Batch lines as tables of numpy columns: the time series every load rule reads.

Decode and prefill lines (SGLang) and stats lines (vLLM) are many, so they are kept as columns, never as one
object per line: one table per kind with `source`, `line`, `time`, `rank` (index into `ranks`) and every
numeric field under its canonical name (float64, NaN where a line does not print it; booleans as 1.0 / 0.0).
`Rows` is a selection of a table's lines, read column by column.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.messages import BATCH_KINDS
from toolkit.diagnose.read.rank import NO_RANK, Rank, rank

META = ("source", "line", "time", "rank")
_DTYPES = {"source": np.int16, "line": np.int64, "time": np.float64, "rank": np.int16}


@dataclass(slots=True)
class BatchTable:
    """The lines of one batch kind as columns of equal length in (source, line) order; `ranks[code]` names
    the rank codes (one list shared by every kind's table)."""

    kind: str
    columns: dict[str, np.ndarray]
    ranks: list[Rank]

    def __len__(self) -> int:
        return len(self.columns["line"])

    @classmethod
    def empty(cls, kind: str, ranks: list[Rank] | None = None) -> BatchTable:
        return cls(kind, {name: np.zeros(0, dtype) for name, dtype in _DTYPES.items()}, ranks if ranks is not None else [])

    def rows(self, mask: np.ndarray | None = None) -> Rows:
        return Rows(self, None if mask is None else np.flatnonzero(mask))


class Rows:
    """A selection of a `BatchTable`'s lines. `rows[name]` is that column for these lines (NaN where absent;
    `rank` as names), `where(mask)` a narrower selection; the order is the table's. `index` None selects
    every line (its columns are the table's own, read-only)."""

    __slots__ = ("table", "index", "_columns")

    def __init__(self, table: BatchTable, index: np.ndarray | None) -> None:
        self.table, self.index = table, index
        self._columns: dict[str, np.ndarray] = {}  # columns read so far (rules read a few, several times)

    def __len__(self) -> int:
        return len(self.table) if self.index is None else len(self.index)

    def __contains__(self, name: str) -> bool:
        return name in self.table.columns and len(self) > 0 and bool(np.isfinite(self[name]).any())

    def __getitem__(self, name: str) -> np.ndarray:
        cached = self._columns.get(name)
        if cached is not None:
            return cached
        if name == "rank":
            names = np.array(self.table.ranks or [NO_RANK], dtype=object)
            values = names[self._codes()]
        else:
            column = self.table.columns.get(name)
            if column is None:
                values = np.full(len(self), np.nan)
            else:
                values = column.view() if self.index is None else column[self.index]
        values.flags.writeable = False
        self._columns[name] = values
        return values

    def _codes(self) -> np.ndarray:
        codes = self.table.columns["rank"]
        return codes if self.index is None else codes[self.index]

    def where(self, mask: np.ndarray) -> Rows:
        return Rows(self.table, np.flatnonzero(mask) if self.index is None else self.index[mask])

    def head(self, n: int) -> Rows:
        return Rows(self.table, np.arange(min(n, len(self))) if self.index is None else self.index[:n])

    def rank_is(self, rank: Rank) -> np.ndarray:
        """A mask of these lines: those of `rank` (compared by code, without making the names)."""
        ranks = self.table.ranks
        return self._codes() == ranks.index(rank) if rank in ranks else np.zeros(len(self), bool)

    def of_rank(self, rank: Rank) -> Rows:
        return self.where(self.rank_is(rank))

    @property
    def ranks(self) -> tuple[Rank, ...]:
        counts = np.bincount(self._codes(), minlength=len(self.table.ranks))
        return tuple(sorted(self.table.ranks[c] for c in np.flatnonzero(counts).tolist()))

    def median(self, name: str) -> float:
        return self.quantile(name, 0.5)

    def quantile(self, name: str, q: float) -> float:
        """The q-quantile of a column's numbers (NaN when it has none); kept, as rules ask for the same ones."""
        key = f"{name}@{q!r}"
        cached = self._columns.get(key)
        if cached is None:
            values = self[name]
            values = values[~np.isnan(values)]
            cached = np.array(float(np.quantile(values, q, overwrite_input=True)) if len(values) else float("nan"))
            self._columns[key] = cached
        return float(cached)

    def fraction(self, mask: np.ndarray) -> float:
        return float(mask.sum()) / len(self) if len(self) else 0.0


class _Growing:
    """One kind's columns as its parts arrive: rows [0, n) filled, room for more behind them (untouched, so
    not yet memory). Parts are copied in as they come, while later chunks are still being read."""

    def __init__(self) -> None:
        self.n = 0
        self.capacity = 0
        self.columns: dict[str, np.ndarray] = {}
        self.last_key = -1
        self.ordered = True

    def reserve(self, rows: int) -> None:
        if rows > self.capacity:
            self.capacity = rows
            for name, column in self.columns.items():
                grown = np.empty(rows, column.dtype)
                grown[: self.n] = column[: self.n]
                self.columns[name] = grown

    def add(self, part: dict[str, np.ndarray]) -> None:
        k = len(part["line"])
        if self.n + k > self.capacity:
            self.reserve(max(self.n + k, self.capacity * 3 // 2, 1024))
        n = self.n
        for name, values in part.items():
            column = self.columns.get(name)
            if column is None:
                column = self.columns[name] = np.empty(self.capacity, _DTYPES.get(name, np.float64))
                if n:
                    column[:n] = np.nan
            column[n: n + k] = values
        for name, column in self.columns.items():
            if name not in part:
                column[n: n + k] = np.nan
        # NOTE: a part is in line order (the fast path's and the per-line parser's are); parts may not follow.
        first, last = (int(part["source"][i]) * (1 << 40) + int(part["line"][i]) for i in (0, -1))
        self.ordered &= first >= self.last_key
        self.last_key = max(self.last_key, last)
        self.n += k

    def table(self, kind: str, ranks: list[Rank], window: tuple[float, float] | None) -> BatchTable:
        if not self.n:
            return BatchTable.empty(kind, ranks)
        columns = {name: column[: self.n] for name, column in self.columns.items()}
        if not self.ordered:
            order = np.argsort(columns["source"].astype(np.int64) * (1 << 40) + columns["line"], kind="stable")
            columns = {name: values[order] for name, values in columns.items()}
        if window is not None:
            time = columns["time"]
            inside = (time >= window[0]) & (time <= window[1])
            columns = {name: values[inside] for name, values in columns.items()}
        return BatchTable(kind, columns, ranks)


class BatchTableBuilder:
    """Collects batch lines as they are read (column parts from the fast path, events from the per-line
    parser), copying each part into its kind's columns at once, and builds one table per kind."""

    def __init__(self) -> None:
        self._kinds: dict[str, _Growing] = {kind: _Growing() for kind in BATCH_KINDS}
        self._ranks: dict[str, int] = {}
        self.ranks: list[Rank] = []

    def rank_codes(self, names: Iterable[str]) -> np.ndarray:
        """The codes of ranks by name (a worker's names come as text: each is typed here, once)."""
        codes = []
        for name in names:
            code = self._ranks.get(name)
            if code is None:
                code = self._ranks[name] = len(self.ranks)
                self.ranks.append(rank(name))
            codes.append(code)
        return np.array(codes, np.int16)

    def reserve(self, kind: str, rows: int) -> None:
        """Room for about `rows` lines of `kind` in all (a guess from the first chunk; wrong only costs time)."""
        self._kinds[kind].reserve(rows)

    def rows(self, kind: str) -> int:
        return self._kinds[kind].n

    def add_columns(self, kind: str, columns: dict[str, np.ndarray]) -> None:
        if len(columns["line"]):
            self._kinds[kind].add(columns)

    def events_parts(self, events: list[Event]) -> dict[str, dict[str, np.ndarray]]:
        """The columns of batch-kind events read by the per-line parser (numbers only), by kind."""
        by_kind: dict[str, list[Event]] = {}
        for e in events:
            by_kind.setdefault(e.kind, []).append(e)
        return {kind: self._events_part(rows) for kind, rows in by_kind.items()}

    def _events_part(self, events: list[Event]) -> dict[str, np.ndarray]:
        n = len(events)
        part: dict[str, np.ndarray] = {
            "source": np.array([e.source for e in events], np.int16),
            "line": np.array([e.line for e in events], np.int64),
            "time": np.array([np.nan if e.time is None else e.time for e in events], np.float64),
            "rank": self.rank_codes(e.rank for e in events),
        }
        fields: dict[str, list[float]] = {}
        for i, e in enumerate(events):
            for name, value in parse_fields(e.kind, e.text).items():
                number = _number(value)
                if number is None:
                    continue
                column = fields.get(name)
                if column is None:
                    column = fields[name] = [math.nan] * n
                column[i] = number
        for name, column in fields.items():
            if name not in part:  # NOTE: a field named like a META column is not kept: the prefix says those
                part[name] = np.array(column, np.float64)
        return part

    def latest_time(self) -> float | None:
        """The latest time a batch line printed (None if none did): a dated one whenever the log has any."""
        latest = [float(np.nanmax(g.columns["time"][: g.n])) for g in self._kinds.values()
                  if g.n and "time" in g.columns and not np.isnan(g.columns["time"][: g.n]).all()]
        return max(latest, default=None)

    def build(self, window: tuple[float, float] | None = None) -> dict[str, BatchTable]:
        tables = {kind: growing.table(kind, self.ranks, window) for kind, growing in self._kinds.items()}
        self._kinds = {kind: _Growing() for kind in BATCH_KINDS}
        return tables


def merge_parts(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two parts of one chunk as one, in line order."""
    n1, n2 = len(first["line"]), len(second["line"])
    names = list(dict.fromkeys([*first, *second]))
    joined = {name: np.concatenate([first.get(name, np.full(n1, np.nan)), second.get(name, np.full(n2, np.nan))])
              .astype(_DTYPES.get(name, np.float64), copy=False) for name in names}
    order = np.argsort(joined["line"], kind="stable")
    return {name: values[order] for name, values in joined.items()}


def _number(value: object) -> float | None:
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None  # type: ignore[arg-type,return-value]
    if kind is bool:
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRecords:
    """What reading the logs gives: the batch lines as one table per kind, every other event by kind (the facts the
    lines' prefixes told among them, `messages.FACT_KINDS`), the ranks of the batch lines, the batch kinds read
    (before any window), and what the log's forms prove of the engine's release (`eras`): SGLang's era, vLLM's
    generation."""

    batches: Mapping[str, BatchTable]
    events: Mapping[str, list[Event]] = field(default_factory=dict)
    ranks: list[Rank] = field(default_factory=list)
    batch_kinds: frozenset[str] = frozenset()
    era: str | None = None
    vllm_generation: str | None = None
