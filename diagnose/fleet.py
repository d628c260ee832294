"""A fleet (docs/log-formats.md §6.5): one log per worker (separate servers, usually behind a router), each
diagnosed on its own, and what only their comparison shows.

- `fleet.imbalance`: over the window all running workers share, one worker's mean running requests (or output
  token throughput) is at least IMBALANCE x another's, and the busier one is really busy. The balance is the
  router's policy, not a server flag: no change is given.
- `fleet.retracting_while_others_idle`: one worker retracts (vLLM: preempts) at least FREQUENT_PER_MIN per busy
  minute while another has no retraction and either runs at most IDLE_SHARE of its batch or has at most
  FREE_USAGE of its KV pool used.
- `fleet.missing_worker`: a worker whose log has no load lines, or ends more than max(MISSING_GAP_S, MISSING_SHARE
  of the fleet's span) before the last worker's log ends.

A worker's load counts each DP group once (its TP ranks print the same batch) and adds the DP groups up.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from toolkit.diagnose.analysis import Diagnosis, analyze
from toolkit.diagnose.findings import Evidence, Finding, rank_of
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import Engine

IMBALANCE = 2.0
BUSY_RUNNING = 2.0         # the busier worker's mean batch must be at least this for an imbalance
BUSY_THROUGHPUT = 50.0     # ... or its output tokens/s at least this
FREQUENT_PER_MIN = 1.0
IDLE_SHARE = 0.5
FREE_USAGE = 0.5
MISSING_GAP_S = 60.0
MISSING_SHARE = 0.1
LOG_SUFFIXES = (".log", ".log.gz", ".txt", ".gz")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's numbers over the fleet window: mean running requests and output tokens/s (summed over its DP
    groups), median KV usage, retractions (and their worst rate per busy minute), where its log starts and ends."""

    name: str
    load_lines: int
    running: float | None = None
    throughput: float | None = None
    usage: float | None = None
    retractions: int = 0
    retraction_rate: float | None = None
    start: float | None = None
    end: float | None = None

    def facts(self) -> dict[str, float | int | None]:
        rounded = {k: None if v is None else round(v, 3) for k, v in
                   (("running", self.running), ("throughput", self.throughput), ("usage", self.usage),
                    ("retraction_rate", self.retraction_rate))}
        return {"load_lines": self.load_lines, **rounded, "retractions": self.retractions, "start": self.start,
                "end": self.end}


@dataclass(frozen=True, slots=True)
class Worker:
    name: str
    source: str
    diagnosis: Diagnosis


@dataclass(slots=True)
class FleetDiagnosis:
    """Every worker's diagnosis, their loads over `window` (the time all running workers' logs share), and the
    fleet findings (most severe first)."""

    workers: list[Worker]
    loads: list[WorkerLoad]
    findings: list[Finding]
    window: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> str | None:
        severities = [f.severity for f in self.findings] + [w.diagnosis.worst for w in self.workers]
        return max((s for s in severities if s is not None), key=rank_of, default=None)

    def fails(self, threshold: str) -> bool:
        return any(rank_of(f.severity) >= rank_of(threshold) for f in self.findings) or any(
            w.diagnosis.fails(threshold) for w in self.workers)


# -- inputs ---------------------------------------------------------------------------------------------------

def worker_name(path: str | Path) -> str:
    """The worker's name: the file name without its log suffixes (`w1.log.gz` -> `w1`)."""
    name = Path(path).name
    for suffix in (".gz", ".log", ".txt"):
        name = name.removesuffix(suffix)
    return name or Path(path).name


def logs_in(directory: str | Path) -> list[Path]:
    """The worker logs of a directory: its files ending in LOG_SUFFIXES, hidden files left out, by name."""
    return sorted(p for p in Path(directory).iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name.endswith(LOG_SUFFIXES))


def worker_names(paths: Sequence[str | Path]) -> list[str]:
    """One name per log: its stem, or its path where two stems are equal."""
    stems = [worker_name(p) for p in paths]
    return [stem if stems.count(stem) == 1 else str(p) for stem, p in zip(stems, paths)]


# -- analysis -------------------------------------------------------------------------------------------------

def analyze_fleet(paths: Sequence[str | Path]) -> FleetDiagnosis:
    """Diagnose each log as one worker, then compare the workers."""
    workers = [Worker(name, str(path), analyze([path])) for name, path in zip(worker_names(paths), paths)]
    return compare(workers)


def compare(workers: list[Worker]) -> FleetDiagnosis:
    spans = {w.name: _log_span(w.diagnosis) for w in workers}
    missing = _missing(workers, spans)
    gone = {f.evidence.facts["worker"] for f in missing}
    window = _common_window([spans[w.name] for w in workers if w.name not in gone and _loaded(w)])
    loads = [_load(w, window, spans[w.name]) for w in workers]
    running = [load for load in loads if load.name not in gone and load.load_lines]
    engine = workers[0].diagnosis.config.advice_engine if workers else "sglang"
    found = [f for f in (_imbalance(running, window),) if f is not None] + _retracting(running, engine) + missing
    found = sorted((replace(f, engine=engine) for f in found), key=lambda f: -rank_of(f.severity))
    notes = [] if window or len(running) < 2 else ["the running workers' logs share no time window (or have no "
                                                   "times): their whole logs are compared"]
    return FleetDiagnosis(workers, loads, found, window, notes)


def _loaded(worker: Worker) -> bool:
    return len(worker.diagnosis.timeline.load()) > 0


def _log_span(d: Diagnosis) -> tuple[float, float] | None:
    """First and last time of the log's batch lines and events, None without times."""
    times = list(d.timeline.span or ())
    times += [e.time for rows in d.timeline.events.values() for e in rows if e.time is not None]
    return (min(times), max(times)) if times else None


def _common_window(spans: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    known = [s for s in spans if s is not None]
    if len(known) < 2 or len(known) < len(spans):
        return None
    start, end = max(s[0] for s in known), min(s[1] for s in known)
    return (start, end) if end > start else None


def _in_window(load: Rows, window: tuple[float, float] | None) -> Rows:
    if window is None:
        return load
    times = load["time"]
    return load.where((times >= window[0]) & (times <= window[1]))


def _summed_over_groups(rows: Rows, name: str) -> float | None:
    """The mean of `name` per DP group (its TP ranks averaged), summed over the groups; None when no line has it."""
    values = rows[name]
    if not np.isfinite(values).any():
        return None
    groups = np.array([r.dp_group for r in rows["rank"]], dtype=object)
    return float(sum(np.nanmean(values[groups == g]) for g in set(groups.tolist())
                     if np.isfinite(values[groups == g]).any()))


def _load(worker: Worker, window: tuple[float, float] | None, span: tuple[float, float] | None) -> WorkerLoad:
    timeline = worker.diagnosis.timeline
    rows = _in_window(timeline.load(), window)
    busy = rows.where(~rows["after_idle"].astype(bool))
    count, rate, _ = Context(timeline).retraction_rate()
    usage = float(np.nanmedian(rows["usage"])) if np.isfinite(rows["usage"]).any() else None
    return WorkerLoad(worker.name, len(timeline.load()), _summed_over_groups(rows, "running_req"),
                      _summed_over_groups(busy, "gen_throughput"), usage, count, rate,
                      span[0] if span else None, span[1] if span else None)


def _per_worker(loads: list[WorkerLoad], name: str) -> dict[str, float | int | None]:
    return {f"{load.name}.{name}": load.facts()[name] for load in loads}


# -- findings -------------------------------------------------------------------------------------------------

def _ratio(loads: list[WorkerLoad], name: str, busy: float) -> tuple[WorkerLoad, WorkerLoad, float] | None:
    """(busiest, least busy, their ratio) of `name` when it is at least IMBALANCE and the busiest is busy."""
    known = [load for load in loads if getattr(load, name) is not None]
    if len(known) < 2:
        return None
    top = max(known, key=lambda load: getattr(load, name))
    low = min(known, key=lambda load: getattr(load, name))
    high, small = getattr(top, name), getattr(low, name)
    if high < busy or high < IMBALANCE * small:
        return None
    return top, low, (high / small if small > 0 else float("inf"))


def _imbalance(loads: list[WorkerLoad], window: tuple[float, float] | None) -> Finding | None:
    found = [(name, r) for name, busy in (("running", BUSY_RUNNING), ("throughput", BUSY_THROUGHPUT))
             if (r := _ratio(loads, name, busy)) is not None]
    if not found:
        return None
    name, (top, low, ratio) = found[0]
    words = {"running": "mean running requests", "throughput": "output tokens/s"}
    times = "" if ratio == float("inf") else f" ({ratio:.1f}x)"
    per_worker = ", ".join(f"{load.name} {getattr(load, name):.1f}" for load in loads
                           if getattr(load, name) is not None)
    return Finding(
        id="fleet.imbalance", severity="warning", title="Load is unbalanced across the workers",
        message=f"Over the same window, {top.name} ran {getattr(top, name):.1f} {words[name]} and {low.name} "
        f"{getattr(low, name):.1f}{times} ({words[name]} per worker: {per_worker}). Whatever sends the requests "
        "(a router, a load balancer, the clients) does not spread them evenly. The balance is the router's policy, "
        "not a server flag: no server change fixes it.",
        evidence=Evidence(count=len(loads), span=window,
                          facts={**_per_worker(loads, "running"), **_per_worker(loads, "throughput")}),
        action="router: balance by load (sglang-router --policy power_of_two or cache_aware with its balance "
               "thresholds), and check that every worker is registered and healthy",
        tradeoff="Load-based routing can cost prefix-cache hits that cache-aware routing kept.")


def _retracting(loads: list[WorkerLoad], engine: Engine) -> list[Finding]:
    out = []
    for hot in loads:
        if hot.retraction_rate is None or hot.retraction_rate < FREQUENT_PER_MIN:
            continue
        calm = [other for other in loads if other is not hot and other.retractions == 0 and _has_room(other, hot)]
        if calm:
            out.append(_retracting_finding(hot, calm, loads, engine))
    return out


def _has_room(other: WorkerLoad, hot: WorkerLoad) -> bool:
    idle = other.running is not None and hot.running is not None and other.running <= IDLE_SHARE * hot.running
    free = other.usage is not None and other.usage <= FREE_USAGE
    return idle or free


def _retracting_finding(hot: WorkerLoad, calm: list[WorkerLoad], loads: list[WorkerLoad], engine: Engine) -> Finding:
    names = ", ".join(c.name for c in calm)
    verb, did = ("preempts", "preempted") if engine == "vllm" else ("retracts", "retracted")
    return Finding(
        id="fleet.retracting_while_others_idle", severity="warning", title=f"One worker {verb} while others have room",
        message=f"{hot.name} {did} {hot.retractions} times ({hot.retraction_rate:.1f} per busy minute) while {names} "
        f"had none and sat idle or with free KV (running: "
        + ", ".join(f"{w.name} {w.running:.1f}" for w in loads if w.running is not None) + "; median KV usage: "
        + ", ".join(f"{w.name} {w.usage:.2f}" for w in loads if w.usage is not None)
        + f"). The requests sent to {hot.name} did not fit it while the others could have run them: the routing, "
        "not the worker's memory, is what to change.",
        evidence=Evidence(count=hot.retractions, facts={"worker": hot.name, **_per_worker(loads, "retractions"),
                                                   **_per_worker(loads, "running"), **_per_worker(loads, "usage")}),
        action="router: route by load (sglang-router --policy power_of_two), or cap each worker's batch "
               "(--max-running-requests) so a full worker is skipped",
        tradeoff="Load-based routing can cost prefix-cache hits that cache-aware routing kept.")


def _missing(workers: list[Worker], spans: dict[str, tuple[float, float] | None]) -> list[Finding]:
    ends = [s[1] for s in spans.values() if s is not None]
    starts = [s[0] for s in spans.values() if s is not None]
    last = max(ends) if ends else None
    allowed = max(MISSING_GAP_S, MISSING_SHARE * (last - min(starts))) if last is not None else None
    out = []
    for w in workers:
        span = spans[w.name]
        if not _loaded(w):
            out.append(_missing_finding(w.name, "its log has no load lines (no decode or stats line)", span, last))
        elif span is not None and last is not None and allowed is not None and last - span[1] > allowed:
            out.append(_missing_finding(w.name, f"its log ends {last - span[1]:.0f} s before the last worker's",
                                        span, last))
    return out


def _missing_finding(name: str, why: str, span: tuple[float, float] | None, last: float | None) -> Finding:
    return Finding(
        id="fleet.missing_worker", severity="warning", title=f"Worker {name} is missing from the fleet",
        message=f"Worker {name} served no load for part of the run: {why}. It may have crashed, hung, been restarted "
        "or been taken out of the router; its own findings say whether its log shows why.",
        evidence=Evidence(count=1, span=span, facts={"worker": name, "ended_s_before_last": round(last - span[1], 1)
                                     if span and last is not None else None}),
        action=f"check worker {name}: its process, its health endpoint and the router's worker list")
