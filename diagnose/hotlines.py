"""Hot lines kept as the blocks they were read from: their fields as a frame now, their rows only when asked.

`analyze` reads decode, prefill and access lines through the block scanner and reader; a `HotBlock` keeps
one block's bytes and the scanner's columns, so a timeline holds no Python tuple or string per hot line.
`Events` is the timeline's `{kind: rows}`, with the hot rows made on first access of their kind.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from toolkit.diagnose.columns import BatchFields, hot_frame
from toolkit.diagnose.scan import ACCESS, KINDS, FastLines

if TYPE_CHECKING:
    import pandas as pd

Row = tuple


@dataclass(frozen=True, slots=True)
class Lines:
    """The scanner's columns a block keeps: per hot line its index in the block, kind, time, rank and bytes."""

    index: np.ndarray
    kind: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, fast: FastLines) -> Lines:
        return cls(fast.index.astype(np.int32), fast.kind, fast.time, fast.rank, fast.start.astype(np.int32),
                   fast.end.astype(np.int32))


@dataclass(slots=True)
class HotBlock:
    """One block's hot lines (those the parser did not emit as rows), the fields the block reader read
    for its decode and prefill lines, and the lines it could not read (`unread`, indices into `fast`)."""

    data: bytes
    fast: Lines
    keep: np.ndarray
    first_line: int
    source: int
    frame: pd.DataFrame
    unread: np.ndarray

    @classmethod
    def read(cls, data: bytes, fast: FastLines, first_line: int, source: int,
             fields: BatchFields | None = None) -> HotBlock:
        """The block's hot lines; `fields` is `batch_fields(fast)` when the caller has read them already."""
        keep = np.ones(len(fast.index), bool)
        keep[np.searchsorted(fast.index, fast.routed)] = False
        frame, read = hot_frame(fast, first_line, source, fields)
        frame = frame[keep[read]]
        unread = fast.kind != ACCESS
        unread[read] = False
        return cls(data, Lines.of(fast), keep, first_line, source, frame, np.flatnonzero(unread & keep))

    def within(self, window: tuple[float, float] | None) -> HotBlock:
        """The block with only the lines inside `window` (every hot kind is a time series)."""
        if window is None:
            return self
        inside = (self.fast.time >= window[0]) & (self.fast.time <= window[1])
        frame = self.frame[(self.frame["time"] >= window[0]) & (self.frame["time"] <= window[1])]
        return HotBlock(self.data, self.fast, self.keep & inside, self.first_line, self.source, frame,
                        self.unread[inside[self.unread]])

    def rows(self, kind: str | None = None, only: np.ndarray | None = None) -> list[Row]:
        """Parser rows of the kept lines of `kind`, or of the lines `only`."""
        pick = only if only is not None else np.flatnonzero(self.keep & (self.fast.kind == _code(kind)))
        text = self.data.decode("ascii")
        fast = self.fast
        texts = map(text.__getitem__, map(slice, fast.start[pick].tolist(), fast.end[pick].tolist()))
        return list(zip(KINDS[fast.kind[pick]].tolist(), (fast.index[pick].astype(np.int64) + self.first_line).tolist(),
                        fast.time[pick].tolist(), fast.rank[pick].tolist(), texts, [self.source] * len(pick)))

    def kinds(self) -> set[str]:
        return {str(k) for k in KINDS[np.unique(self.fast.kind[self.keep])]}

    def edge(self, kind: str, last: bool) -> tuple[tuple[int, int], str] | None:
        """((source, line), text) of the first or last kept line of `kind`."""
        where = np.flatnonzero(self.keep & (self.fast.kind == _code(kind)))
        if len(where) == 0:
            return None
        i = where[-1] if last else where[0]
        text = self.data[self.fast.start[i]: self.fast.end[i]].decode("ascii")
        return (self.source, int(self.fast.index[i]) + self.first_line), text


def _code(kind: str | None) -> int:
    names = KINDS.tolist()
    return names.index(kind) if kind in names else -1


class Events(Mapping):
    """`{kind: rows in (source, line) order}` over parser rows and hot blocks; hot rows are made per kind
    on first access (exporting every event makes them all)."""

    def __init__(self, rows: dict[str, list[Row]], hot: list[HotBlock]) -> None:
        self._rows, self._hot, self._made = rows, hot, {}
        self._kinds = set(rows) | set().union(*(block.kinds() for block in hot))

    def __getitem__(self, kind: str) -> list[Row]:
        if kind not in self._kinds:
            raise KeyError(kind)
        if kind not in self._made:
            hot = [row for block in self._hot for row in block.rows(kind)]
            rows = self._rows.get(kind, [])
            self._made[kind] = sorted(rows + hot, key=itemgetter(5, 1)) if hot else rows
        return self._made[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._kinds))

    def __len__(self) -> int:
        return len(self._kinds)

    def edge_texts(self) -> dict[str, str]:
        """The first and last text of every kind (`kind`, `kind#last`), without making hot rows."""
        out: dict[str, str] = {}
        for kind in self:
            out.update(self._edges(kind))
        return out

    def _edges(self, kind: str) -> dict[str, str]:
        rows = self._rows.get(kind, [])
        firsts = [((r[5], r[1]), r[4]) for r in rows[:1]] + [e for b in self._hot if (e := b.edge(kind, False))]
        lasts = [((r[5], r[1]), r[4]) for r in rows[-1:]] + [e for b in self._hot if (e := b.edge(kind, True))]
        if not firsts:
            return {}
        return {kind: min(firsts)[1], f"{kind}#last": max(lasts)[1]}
