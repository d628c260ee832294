"""Timeline: the batch table with its derived columns, phases (idle / ramp / steady / drain), and the events.

The load series is the periodic line of the engine: SGLang's decode line, or vLLM's stats line. Rules judge
its steady phase: a busy segment's steady part runs from the first to the last load line whose running batch
is near the segment's plateau (or that has a queue); before it is ramp, after it drain, and gaps without load
lines are idle. The first load line after idle is marked `after_idle`: its throughput window spans the idle
time (docs/log-formats.md §7), so no rule reads its throughput. Prefill lines take the phase of the load line
before them on their rank.

Per-rank pandas frames (`Timeline.frames`) are built only when asked for (plots in other tools, the API).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.series import BatchTable, Rows

if TYPE_CHECKING:
    import pandas as pd

Phase = Literal["idle", "ramp", "steady", "drain"]
PHASES = ("ramp", "steady", "drain")  # codes 0, 1, 2 of the `phase` column (-1: not a load or prefill line)
RAMP, STEADY, DRAIN = 0, 1, 2

IDLE_GAP_S = 10.0          # a gap between load lines longer than this (and 5x the median gap) is idle
IDLE_GAP_MEDIANS = 5.0
PLATEAU_QUANTILE = 0.9     # a segment's plateau is this quantile of its #running-req
STEADY_FRACTION = 0.8      # a line is "loaded" at >= 80% of the plateau, or with a queue
MIN_SEGMENT_LINES = 3      # shorter busy segments are all ramp


class PhaseSpan(NamedTuple):
    rank: str
    phase: str
    start: float | None
    end: float | None
    first_line: int
    last_line: int


@dataclass(slots=True)
class Timeline:
    """Everything the rules read. `batches[kind]` holds every decode, prefill or stats line with its fields and
    the derived columns `usage`, `hit_rate`, `phase` and (load lines) `after_idle`; `events` the other events
    by kind."""

    config: ServerConfig
    batches: Mapping[str, BatchTable]
    events: Mapping[str, list[Event]]
    phases: list[PhaseSpan] = field(default_factory=list)
    decode_log_interval: int = 40
    load_kind: str = "decode"
    _frames: dict[str, pd.DataFrame] | None = field(default=None, repr=False)
    _series: dict[tuple[str, str | None], Rows] = field(default_factory=dict, repr=False)

    @property
    def ranks(self) -> list[str]:
        """Ranks with load lines."""
        return list(self.load().ranks)

    def kind(self, kind: str) -> list[Event]:
        return list(self.events.get(kind, []))

    def series(self, kind: str, phase: str | None = None) -> Rows:
        """The lines of one batch kind, optionally of one phase only (made once: the tables do not change)."""
        rows = self._series.get((kind, phase))
        if rows is None:
            rows = self.batches[kind].rows()
            if phase is not None:
                rows = rows.where(rows["phase"] == PHASES.index(phase))
            self._series[(kind, phase)] = rows
        return rows

    def load(self, phase: str | None = None) -> Rows:
        """The load series: decode lines (SGLang) or stats lines (vLLM)."""
        return self.series(self.load_kind, phase)

    def steady(self) -> Rows:
        return self.load("steady")

    def busy_seconds(self, rank: str) -> float | None:
        """Wall time of `rank`'s busy segments (first to last load line of each), None without times."""
        total, start, end = 0.0, None, None
        spans = [p for p in self.phases if p.rank == rank]
        for p in spans:
            if p.start is None or p.end is None:
                return None
            if p.phase == "idle":
                total += (end or 0.0) - (start or 0.0)
                start = end = None
                continue
            start = p.start if start is None else start
            end = p.end
        return total + ((end or 0.0) - (start or 0.0)) if spans else None

    @property
    def span(self) -> tuple[float, float] | None:
        times = np.concatenate([t.columns["time"] for t in self.batches.values()])
        times = times[~np.isnan(times)]
        return (float(times.min()), float(times.max())) if len(times) else None

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        """`{rank: DataFrame}` of each rank's batch lines with every column (`phase` as text), in time order;
        ranks without load lines have none."""
        if self._frames is None:
            self._frames = _frames(self)
        return self._frames


# -- building -------------------------------------------------------------------------------------------

def build_timeline(batches: Mapping[str, BatchTable], events: Mapping[str, list[Event]],
                   config: ServerConfig) -> Timeline:
    """Derive usage, hit rate, phases and the idle flag; returns the timeline the rules read."""
    load_kind = "stats" if len(batches["stats"]) and not len(batches["decode"]) else "decode"
    total = config.max_total_num_tokens
    for table in batches.values():
        columns, n = table.columns, len(table)
        printed = _column(columns, "token_usage", n)
        if total and "token" in columns:
            usage = columns["token"] / total
            columns["usage"] = np.where(np.isnan(usage), printed, usage)
        else:
            columns["usage"] = printed.copy()
        columns["phase"] = np.full(n, -1, np.int8)
        columns["after_idle"] = np.zeros(n, bool)
    prefill = batches["prefill"].columns
    cached = _column(prefill, "cached_token", len(batches["prefill"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        prefill["hit_rate"] = cached / (cached + _column(prefill, "new_token", len(cached)))
    load = batches[load_kind]
    spans: list[PhaseSpan] = []
    codes = np.flatnonzero(np.bincount(load.columns["rank"], minlength=len(load.ranks))).tolist()
    for code in sorted(codes, key=lambda c: load.ranks[c]):
        rows = np.flatnonzero(load.columns["rank"] == code)
        times = load.columns["time"][rows]
        _phases(load.columns, rows, times, load.ranks[code], spans)
        if load_kind == "decode":
            _fill_prefill_phase(load.columns, rows, times, prefill, np.flatnonzero(prefill["rank"] == code))
    interval = config.arg("decode_log_interval", 40)
    return Timeline(config, batches, events, spans, int(interval) if isinstance(interval, int) else 40, load_kind)


def _column(columns: dict[str, np.ndarray], name: str, n: int) -> np.ndarray:
    """A column, or NaN for every line where no line prints it."""
    column = columns.get(name)
    return column if column is not None else np.full(n, np.nan)


def _time_order(rows: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`rows` (in table order, at `times`) in time order, ties in table order, unchanged without times; their
    times)."""
    if len(rows) < 2 or bool((times[1:] >= times[:-1]).all()) or np.isnan(times).any():
        return rows, times
    order = np.argsort(times, kind="stable")
    return rows[order], times[order]


def _segments(times: np.ndarray) -> np.ndarray:
    """Segment id per load line; a new segment starts after an idle gap."""
    if len(times) < 2 or np.isnan(times).all():
        return np.zeros(len(times), dtype=int)
    gaps = np.diff(times)
    idle = gaps > max(IDLE_GAP_S, IDLE_GAP_MEDIANS * _median_gap(gaps))
    return np.concatenate([[0], np.cumsum(idle)])


def _median_gap(gaps: np.ndarray) -> float:
    """The median of the gaps' numbers (0 without any), where it can matter: below IDLE_GAP_S / IDLE_GAP_MEDIANS
    the threshold is IDLE_GAP_S whatever it is, and fewer than half the gaps above that bound it below."""
    small = IDLE_GAP_S / IDLE_GAP_MEDIANS
    numbers = np.count_nonzero(~np.isnan(gaps))
    if numbers == 0 or np.count_nonzero(gaps > small) < (numbers + 1) // 2:
        return 0.0
    median = np.nanmedian(gaps)
    return float(median) if np.isfinite(median) else 0.0


def _segment_phases(running: np.ndarray, queue: np.ndarray) -> np.ndarray:
    n = len(running)
    phases = np.full(n, RAMP, np.int8)
    if n and queue[0] > 0 and queue[-1] > 0:
        # NOTE: a queue at both ends makes the whole segment steady, whatever the plateau and however short: a
        # request waiting is demand above what runs (a rank of a DP excerpt may print one or two lines).
        phases[:] = STEADY
        return phases
    if n < MIN_SEGMENT_LINES:
        return phases
    plateau = np.nanquantile(running, PLATEAU_QUANTILE) if np.isfinite(running).any() else 0
    loaded = (np.nan_to_num(running) >= STEADY_FRACTION * plateau) | (np.nan_to_num(queue) > 0)
    idx = np.flatnonzero(loaded)
    if len(idx) == 0:
        return phases
    phases[idx[0]: idx[-1] + 1] = STEADY
    phases[idx[-1] + 1:] = DRAIN
    return phases


def _phases(columns: dict[str, np.ndarray], rows: np.ndarray, times: np.ndarray, rank: str,
            spans: list[PhaseSpan]) -> None:
    rows, times = _time_order(rows, times)
    phase, after_idle = columns["phase"], columns["after_idle"]
    running = _column(columns, "running_req", len(columns["line"]))[rows]
    queue = _column(columns, "queue_req", len(columns["line"]))[rows]
    seg = _segments(times)
    starts = np.flatnonzero(np.concatenate([[True], np.diff(seg) > 0]))
    bounds = np.concatenate([starts, [len(rows)]])
    ordered = np.empty(len(rows), np.int8)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ordered[a:b] = _segment_phases(running[a:b], queue[a:b])
    phase[rows] = ordered
    after_idle[rows[starts]] = True
    _spans(times, columns["line"][rows], seg, ordered, rank, spans)


def _fill_prefill_phase(load: dict[str, np.ndarray], load_rows: np.ndarray, load_times: np.ndarray,
                       prefill: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """Prefill lines take the phase of the load line before them on their rank (ramp before the first): the
    last one before in line order, or in time order when the rank's lines are not in time order."""
    if not len(rows):
        return
    before = np.searchsorted(*_line_keys(load, load_rows, prefill, rows), side="left") - 1
    times = prefill["time"][rows]
    if not (np.isnan(load_times).any() or np.isnan(times).any()) and not _time_sorted(load_times, times, before):
        order = np.argsort(load_times, kind="stable")
        before = np.searchsorted(load_times[order], times, side="right") - 1
        before = np.where(before >= 0, order[np.maximum(before, 0)], -1)
    phase = load["phase"][load_rows]
    prefill["phase"][rows] = np.where(before >= 0, phase[np.maximum(before, 0)], RAMP)


def _line_keys(a: dict[str, np.ndarray], a_rows: np.ndarray, b: dict[str, np.ndarray],
               b_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, line) of some rows of two tables as one number each; the line alone where both tables hold
    lines of one and the same source (a table is in (source, line) order: its first and last say)."""
    ends = {int(t["source"][i]) for t in (a, b) if len(t["source"]) for i in (0, -1)}
    if len(ends) <= 1:
        return a["line"][a_rows], b["line"][b_rows]
    return tuple(t["source"][rows].astype(np.int64) * (1 << 40) + t["line"][rows]  # type: ignore[return-value]
                 for t, rows in ((a, a_rows), (b, b_rows)))


def _time_sorted(load_time: np.ndarray, times: np.ndarray, before: np.ndarray) -> bool:
    """Whether line order is time order for these lines (then "before in line order" is "before in time")."""
    if len(load_time) > 1 and not bool((load_time[1:] >= load_time[:-1]).all()):
        return False
    if len(times) > 1 and not bool((times[1:] >= times[:-1]).all()):
        return False
    prev = before >= 0
    nxt = before + 1 < len(load_time)
    ok = ~prev | (load_time[np.maximum(before, 0)] <= times)
    ok &= ~nxt | (load_time[np.minimum(before + 1, len(load_time) - 1)] >= times)
    return bool(ok.all())


def _spans(times: np.ndarray, lines: np.ndarray, seg: np.ndarray, phase: np.ndarray, rank: str,
           out: list[PhaseSpan]) -> None:
    """Runs of equal (segment, phase) over the load lines, with an idle span between segments."""
    if len(times) == 0:
        return
    new_seg = np.concatenate([[False], seg[1:] != seg[:-1]])
    starts = np.flatnonzero(np.concatenate([[True], new_seg[1:] | (phase[1:] != phase[:-1])]))
    stops = np.concatenate([starts[1:], [len(times)]]) - 1
    for a, b in zip(starts.tolist(), stops.tolist()):
        if new_seg[a]:
            out.append(PhaseSpan(rank, "idle", _t(times[a - 1]), _t(times[a]), int(lines[a - 1]), int(lines[a])))
        out.append(PhaseSpan(rank, PHASES[phase[a]], _t(times[a]), _t(times[b]), int(lines[a]), int(lines[b])))


def _t(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


# -- derived series -------------------------------------------------------------------------------------

def prefill_time_share(timeline: Timeline, rank: str) -> float | None:
    """Estimated share of steady-state wall time spent in prefill batches (SGLang).

    A decode line's window is `interval * running / gen_throughput` seconds; windows without a prefill line
    give the pure decode step time, and the rest of each window is charged to its prefills."""
    decode, prefill = timeline.batches["decode"], timeline.batches["prefill"]
    if rank not in decode.ranks:
        return None
    code = decode.ranks.index(rank)
    dc, pc = decode.columns, prefill.columns
    d = np.flatnonzero((dc["rank"] == code) & (dc["phase"] == STEADY))
    d, _ = _time_order(d, dc["time"][d])
    p = np.flatnonzero((pc["rank"] == code) & (pc["phase"] == STEADY))
    if len(d) < 3:
        return None
    # NOTE: prefills between two decode lines, counted on the line (or time) order of the rank
    # the tables are in (source, line) order: each prefill falls before the first decode line after it
    between = np.searchsorted(*_line_keys(dc, d, pc, p))
    k = np.bincount(between, minlength=len(d) + 1)[: len(d)]
    interval = timeline.decode_log_interval
    with np.errstate(invalid="ignore", divide="ignore"):
        window = interval * _column(dc, "running_req", len(decode))[d] / _column(dc, "gen_throughput", len(decode))[d]
    ok = np.isfinite(window) & (window > 0) & ~dc["after_idle"][d]
    if ok.sum() < 3 or not ((k == 0) & ok).any():
        return None
    step = np.median(window[(k == 0) & ok]) / interval
    prefill_s = np.maximum(window[ok] - interval * step, 0)
    return float(prefill_s.sum() / window[ok].sum())


def distribution(values: np.ndarray) -> dict[str, float]:
    """p10/p50/p90/max/mean of the numbers in `values` (empty dict when it has none)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return {}
    p10, p50, p90 = np.quantile(values, [0.1, 0.5, 0.9]).tolist()
    return {"p10": p10, "p50": p50, "p90": p90, "max": float(values.max()), "mean": float(values.mean())}


def _frames(timeline: Timeline) -> dict[str, pd.DataFrame]:
    import pandas as pd

    out: dict[str, pd.DataFrame] = {}
    kinds = ("decode", "prefill") if timeline.load_kind == "decode" else ("stats",)
    for rank in timeline.ranks:
        parts = []
        for kind in kinds:
            table = timeline.batches[kind]
            code = table.ranks.index(rank)
            rows = np.flatnonzero(table.columns["rank"] == code)
            frame = {name: values[rows] for name, values in table.columns.items() if name not in ("rank", "phase")}
            frame["kind"] = kind
            frame["rank"] = rank
            frame["phase"] = np.array([*PHASES, None], dtype=object)[table.columns["phase"][rows]]
            parts.append(pd.DataFrame(frame))
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        order = ["time", "source", "line"] if df["time"].notna().all() else ["source", "line"]
        out[rank] = df.sort_values(order, kind="stable").reset_index(drop=True)
    return out
