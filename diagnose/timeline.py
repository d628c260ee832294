"""Timeline: event rows -> per-rank pandas frames, phases (idle / ramp / steady / drain) and derived series.

Rules judge the steady phase: a busy segment's steady part runs from the first to the last decode line whose
running batch is near the segment's plateau (or that has a queue); before it is ramp, after it drain, and
gaps without decode lines are idle. The first decode line after idle is marked `after_idle`: its throughput
window spans the idle time (LOG_FORMATS §6), so no rule reads its throughput.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import compress
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.eras import era_of
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.hotlines import Events, HotBlock
from toolkit.diagnose.parser import Row

Phase = Literal["idle", "ramp", "steady", "drain"]

IDLE_GAP_S = 10.0          # a gap between decode lines longer than this (and 5x the median gap) is idle
IDLE_GAP_MEDIANS = 5.0
PLATEAU_QUANTILE = 0.9     # a segment's plateau is this quantile of its #running-req
STEADY_FRACTION = 0.8      # a line is "loaded" at >= 80% of the plateau, or with a queue
MIN_SEGMENT_LINES = 3      # shorter busy segments are all ramp
BATCH_KINDS = ("decode", "prefill")
BATCH_COLUMNS = ("running_req", "queue_req", "token", "token_usage", "gen_throughput", "new_token", "cached_token",
                 "new_seq")
NUMERIC = frozenset(BATCH_COLUMNS) | {"cache_hit_rate", "input_throughput", "iter"}
# Every rank frame (and the empty frame of a log without decode lines) has at least these columns.
FRAME_SCHEMA: dict[str, str] = {"kind": "object", "line": "int64", "time": "float64", "rank": "object",
                                "source": "int64", **dict.fromkeys(BATCH_COLUMNS, "float64"), "usage": "float64",
                                "hit_rate": "float64", "phase": "object", "after_idle": "bool"}
SERIES_KINDS = frozenset({"decode", "prefill", "retract", "oom", "watchdog", "exception", "leak", "access"})


class PhaseSpan(NamedTuple):
    rank: str
    phase: str
    start: float | None
    end: float | None
    first_line: int
    last_line: int


@dataclass(slots=True)
class Timeline:
    """Everything the rules read. `frames[rank]` holds that rank's decode and prefill lines in time order with
    their fields and the derived columns `usage`, `phase`, `after_idle`, `hit_rate`."""

    config: ServerConfig
    frames: dict[str, pd.DataFrame]
    events: Mapping[str, list[Row]]
    phases: list[PhaseSpan] = field(default_factory=list)
    decode_log_interval: int = 40
    _batches: dict[tuple[str, str | None], pd.DataFrame] = field(default_factory=dict, repr=False)

    @property
    def ranks(self) -> list[str]:
        return sorted(self.frames)

    def kind(self, kind: str) -> list[Row]:
        return self.events.get(kind, [])

    def batches(self, kind: str, phase: str | None = None) -> pd.DataFrame:
        """All ranks' rows of one batch kind, optionally one phase only (computed once; callers filter it,
        never modify it)."""
        if (kind, phase) not in self._batches:
            parts = [f[f["kind"] == kind] for f in self.frames.values()]
            df = pd.concat(parts) if parts else _empty()
            self._batches[(kind, phase)] = df[df["phase"] == phase] if phase is not None else df
        return self._batches[(kind, phase)]

    def steady_decode(self) -> pd.DataFrame:
        return self.batches("decode", "steady")

    def busy_seconds(self, rank: str) -> float | None:
        """Wall time of `rank`'s busy segments (first to last decode line of each), None without times."""
        total, start, end = 0.0, None, None
        for p in (p for p in self.phases if p.rank == rank):
            if p.start is None or p.end is None:
                return None
            if p.phase == "idle":
                total += (end or 0.0) - (start or 0.0)
                start = end = None
                continue
            start = p.start if start is None else start
            end = p.end
        return total + ((end or 0.0) - (start or 0.0)) if self.phases else None

    @property
    def span(self) -> tuple[float, float] | None:
        times = [f["time"].dropna() for f in self.frames.values()]
        times = [t for t in times if len(t)]
        if not times:
            return None
        return float(min(t.min() for t in times)), float(max(t.max() for t in times))


def _empty() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in FRAME_SCHEMA.items()})


# -- config ---------------------------------------------------------------------------------------------

def _first(rows: list[Row]) -> dict:
    return parse_fields(rows[0][0], rows[0][4]) if rows else {}


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_config(events: Mapping[str, list[Row]]) -> ServerConfig:
    """Server configuration from `server_args=` and the startup lines (first occurrence of each)."""
    args = _first(events.get("server_args", []))
    pool = _first(events.get("pool", []))
    load_begin = [parse_fields(r[0], r[4]) for r in events.get("load_begin", [])]
    load_end = _first(events.get("load_end", []))
    kv = _first(events.get("kv_alloc", []))
    graph_end = [parse_fields(r[0], r[4]) for r in events.get("graph_end", [])]
    pool_end = _first(events.get("pool_end", []))
    avail = _num(pool.get("available_gpu_mem"))
    device = "gpu" if avail is not None else None
    if "available_cpu_mem" in pool or str(args.get("device", "")) == "cpu":
        avail, device = _num(pool.get("available_cpu_mem", avail)), "cpu"
    if avail is None:
        candidates = [g.get("avail_mem") for g in graph_end if not g.get("draft")] or [pool_end.get("avail_mem")]
        avail = _num(candidates[-1])
    begins = [v for v in (_num(b.get("avail_mem")) for b in load_begin) if v is not None]
    gpu_mem = max(begins) if begins else None
    weights = _num(load_end.get("mem_usage"))
    if weights is None and begins and _num(load_end.get("avail_mem")) is not None:
        weights = round(begins[0] - float(load_end["avail_mem"]), 2)
    kv_gb = sum(v for v in (_num(kv.get(k)) for k in ("k_size", "v_size", "kv_size")) if v is not None) or None
    graph_mem = sum(v for v in (_num(g.get("mem_usage")) for g in graph_end) if v is not None) or None
    texts = events.edge_texts() if isinstance(events, Events) else _edge_texts(events)
    return ServerConfig(
        args=args,
        max_total_num_tokens=_int(pool.get("max_total_num_tokens"), kv.get("tokens")),
        chunked_prefill_size=_int(pool.get("chunked_prefill_size"), args.get("chunked_prefill_size")),
        max_prefill_tokens=_int(pool.get("max_prefill_tokens"), args.get("max_prefill_tokens")),
        max_running_requests=_int(pool.get("max_running_requests"), args.get("max_running_requests")),
        context_len=_int(pool.get("context_len"), args.get("context_length")),
        available_mem_gb=avail,
        device=device or ("gpu" if gpu_mem is not None else None),
        gpu_mem_gb=gpu_mem,
        weight_mem_gb=weights,
        kv_mem_gb=kv_gb,
        graph_mem_gb=graph_mem,
        dtype=str(load_end["dtype"]) if "dtype" in load_end else None,
        model_class=str(load_end["type"]) if "type" in load_end else None,
        era=era_of(texts),
    )


def _edge_texts(events: Mapping[str, list[Row]]) -> dict[str, str]:
    texts = {k: rows[0][4] for k, rows in events.items() if rows}
    texts.update({f"{k}#last": rows[-1][4] for k, rows in events.items() if rows})
    return texts


def _int(*values: object) -> int | None:
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


# -- frames ---------------------------------------------------------------------------------------------

def batch_frame(rows: list[Row], read: list[pd.DataFrame] = ()) -> pd.DataFrame:
    """Decode/prefill rows with their fields as columns (numeric where the log printed numbers), after the
    frames in `read` of lines whose fields the block reader already read (`diagnose.columns`)."""
    done = pd.concat(read, ignore_index=True) if read else None
    records = []
    for kind, line, time, rank, text, source in rows:
        rec = parse_fields(kind, text)
        rec.update(kind=kind, line=line, time=time, rank=rank, source=source)
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    if done is not None and len(done):
        df = pd.concat([done, df], ignore_index=True) if len(df) else done.reset_index(drop=True)
    for col in ("kind", "rank"):
        df[col] = df[col].astype("category")
    for col in df.columns:
        if col in ("kind", "rank", "cuda_graph") or pd.api.types.is_numeric_dtype(df[col]):
            continue
        converted = pd.to_numeric(df[col].map(_number), errors="coerce")
        if col in NUMERIC or converted.notna().sum() >= df[col].notna().sum() * 0.5:
            df[col] = converted.astype(float)
    return df


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _segments(times: np.ndarray) -> np.ndarray:
    """Segment id per decode line; a new segment starts after an idle gap."""
    if len(times) < 2 or np.isnan(times).all():
        return np.zeros(len(times), dtype=int)
    gaps = np.diff(times)
    median = np.nanmedian(gaps) if np.isfinite(gaps).any() else 0.0
    idle = gaps > max(IDLE_GAP_S, IDLE_GAP_MEDIANS * (median if np.isfinite(median) else 0.0))
    return np.concatenate([[0], np.cumsum(idle)])


def _phase_of_segment(running: np.ndarray, queue: np.ndarray) -> np.ndarray:
    n = len(running)
    phases = np.full(n, "ramp", dtype=object)
    if n < MIN_SEGMENT_LINES:
        return phases
    plateau = np.nanquantile(running, PLATEAU_QUANTILE) if np.isfinite(running).any() else 0
    loaded = np.nan_to_num(running) >= STEADY_FRACTION * plateau
    loaded |= np.nan_to_num(queue) > 0
    idx = np.flatnonzero(loaded)
    if len(idx) == 0:
        return phases
    phases[idx[0]: idx[-1] + 1] = "steady"
    phases[idx[-1] + 1:] = "drain"
    return phases


def _decorate(df: pd.DataFrame, config: ServerConfig, rank: str, spans: list[PhaseSpan]) -> pd.DataFrame:
    df = df.sort_values(["time", "source", "line"] if df["time"].notna().all() else ["source", "line"],
                        kind="stable").reset_index(drop=True)
    for col in BATCH_COLUMNS:
        if col not in df:
            df[col] = np.nan
    total = config.max_total_num_tokens
    df["usage"] = df["token"] / total if total else np.nan
    df["usage"] = df["usage"].fillna(df["token_usage"])
    df["hit_rate"] = df["cached_token"] / (df["cached_token"] + df["new_token"])
    dec = df["kind"] == "decode"
    d = df[dec]
    times = d["time"].to_numpy(dtype=float)
    seg = _segments(times)
    phase = np.empty(len(d), dtype=object)
    for s in np.unique(seg):
        m = seg == s
        phase[m] = _phase_of_segment(d["running_req"].to_numpy(float)[m], d["queue_req"].to_numpy(float)[m])
    df["phase"] = None
    df.loc[dec, "phase"] = phase
    df["after_idle"] = False
    firsts = np.flatnonzero(np.concatenate([[True], np.diff(seg) > 0])) if len(seg) else []
    df.loc[d.index[firsts], "after_idle"] = True
    df["phase"] = df["phase"].ffill().fillna("ramp")
    _spans(d, seg, phase, rank, spans)
    return df


def _spans(d: pd.DataFrame, seg: np.ndarray, phase: np.ndarray, rank: str, out: list[PhaseSpan]) -> None:
    """Runs of equal (segment, phase) over the decode lines, with an idle span between segments."""
    if len(d) == 0:
        return
    times, lines = d["time"].to_numpy(float), d["line"].to_numpy()
    new_seg = np.concatenate([[False], seg[1:] != seg[:-1]])
    starts = np.flatnonzero(np.concatenate([[True], new_seg[1:] | (phase[1:] != phase[:-1])]))
    stops = np.concatenate([starts[1:], [len(d)]]) - 1
    for a, b in zip(starts.tolist(), stops.tolist()):
        if new_seg[a]:
            out.append(PhaseSpan(rank, "idle", _t(times[a - 1]), _t(times[a]), int(lines[a - 1]), int(lines[a])))
        out.append(PhaseSpan(rank, str(phase[a]), _t(times[a]), _t(times[b]), int(lines[a]), int(lines[b])))


def _t(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _kept(row: Row, window: tuple[float, float]) -> bool:
    t = row[2]
    return row[0] not in SERIES_KINDS or (t is not None and window[0] <= t <= window[1])


def _group(rows: list[Row], events: dict[str, list[Row]]) -> None:
    """Append `rows` to their kind's list, in order (one pass per kind present)."""
    kinds = list(map(itemgetter(0), rows))
    for kind in dict.fromkeys(kinds):
        events.setdefault(kind, []).extend(compress(rows, map(kind.__eq__, kinds)))


def build_timeline(batches: Iterable[list[Row]], window: tuple[float, float] | None = None,
                   hot: list[HotBlock] | None = None) -> Timeline:
    """Group rows by kind (keeping config kinds whatever the window), read the config, build rank frames.
    `hot`: the hot lines kept as blocks (filled while `batches` runs), their fields already read."""
    grouped: dict[str, list[Row]] = {}
    for rows in batches:
        _group(rows if window is None else [r for r in rows if _kept(r, window)], grouped)
    blocks = [block.within(window) for block in hot or []]
    events = Events(grouped, blocks)
    config = read_config(events)
    unread = [row for block in blocks for row in block.rows(only=block.unread)]
    batch_rows = grouped.get("decode", []) + grouped.get("prefill", []) + unread
    read = [block.frame for block in blocks if len(block.frame)]
    frames: dict[str, pd.DataFrame] = {}
    spans: list[PhaseSpan] = []
    if batch_rows or read:
        df = batch_frame(batch_rows, read)
        for rank, part in df.groupby("rank", sort=True, observed=True):
            if (part["kind"] == "decode").any():
                frames[str(rank)] = _decorate(part, config, str(rank), spans)
    interval = config.arg("decode_log_interval", 40)
    return Timeline(config, frames, events, spans, int(interval) if isinstance(interval, int) else 40)


# -- derived series -------------------------------------------------------------------------------------

def retractions_per_minute(timeline: Timeline, rank: str) -> pd.Series:
    """Rolling 60 s count of retraction lines of one rank, indexed by time."""
    times = sorted(r[2] for r in timeline.kind("retract") if r[3] == rank and r[2] is not None)
    if not times:
        return pd.Series(dtype=float)
    s = pd.Series(1.0, index=pd.to_datetime(times, unit="s"))
    return s.rolling("60s").sum()


def prefill_time_share(timeline: Timeline, rank: str) -> float | None:
    """Estimated share of steady-state wall time spent in prefill batches.

    A decode line's window is `interval * running / gen_throughput` seconds; windows without a prefill line
    give the pure decode step time, and the rest of each window is charged to its prefills."""
    df = timeline.frames.get(rank)
    if df is None:
        return None
    steady = df[df["phase"] == "steady"]
    dec_mask = (steady["kind"] == "decode").to_numpy()
    prefills_before = np.cumsum(~dec_mask)[dec_mask]
    k = np.diff(np.concatenate([[0], prefills_before]))
    d = steady[dec_mask]
    window = timeline.decode_log_interval * d["running_req"].to_numpy(float) / d["gen_throughput"].to_numpy(float)
    ok = np.isfinite(window) & (window > 0) & ~d["after_idle"].to_numpy(bool)
    if ok.sum() < 3 or not ((k == 0) & ok).any():
        return None
    step = np.median(window[(k == 0) & ok]) / timeline.decode_log_interval
    prefill = np.clip(window[ok] - timeline.decode_log_interval * step, 0, None)
    return float(prefill.sum() / window[ok].sum())


def distribution(series: pd.Series) -> dict[str, float]:
    """p10/p50/p90/max/mean of a numeric series (empty dict when it has no values)."""
    s = pd.to_numeric(series, errors="coerce").dropna()
    if s.empty:
        return {}
    q = s.quantile([0.1, 0.5, 0.9])
    return {"p10": float(q[0.1]), "p50": float(q[0.5]), "p90": float(q[0.9]), "max": float(s.max()),
            "mean": float(s.mean())}
