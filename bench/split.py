"""One schedule over N workers: which arrivals each worker sends, and the merge of what they measured (pure).

Worker w of N gets arrivals w, w + N, w + 2N, ... with their offsets unchanged, so every request still goes out at
its place on the one global schedule. Each worker reports times on its own clock, measured from the shared start;
the merge moves them onto the parent's clock and numbers arrivals globally, so the record is computed from the
union of the samples exactly as from a single process's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from toolkit.bench.metrics import NOT_FAILURES
from toolkit.bench.outcome import RequestOutcome
from toolkit.bench.runner import RunResult
from toolkit.bench.verdict import judge
from toolkit.bench.workload import Workload


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """One worker's part of a run, already on the parent's clock."""

    worker: int
    run: RunResult


def split_workload(workload: Workload, workers: int) -> list[Workload]:
    """The workers' shares of `workload`: every `workers`-th arrival (a request, or a session of `turns` prompts)."""
    turns = workload.turns
    shares = []
    for w in range(workers):
        arrivals = range(w, len(workload.offsets), workers)
        prompts = [p for a in arrivals for p in workload.prompts[a * turns:(a + 1) * turns]]
        shares.append(replace(workload, prompts=prompts, offsets=workload.offsets[w::workers]))
    return shares


def split_cap(max_concurrency: int | None, workers: int, worker: int) -> int | None:
    """A worker's share of `--max-concurrency`: the shares differ by at most one and sum to the cap."""
    if max_concurrency is None:
        return None
    return max_concurrency // workers + (worker < max_concurrency % workers)


def _rebase(out: RequestOutcome, shift: float) -> None:
    # NOTE: 0.0 means "never happened" for these times, so it stays 0.0.
    out.dispatched, out.sent, out.ended = (t + shift if t else 0.0 for t in (out.dispatched, out.sent, out.ended))
    out.token_times = [t + shift for t in out.token_times]


def onto_clock(run: RunResult, worker: int, workers: int, start: float) -> RunResult:
    """`run` moved onto the clock whose schedule starts at `start`, with arrival numbers global: a single request's
    `index`, a session's `session` (a multi-turn request's `index` is renumbered by `merge`)."""
    shift = start - run.start
    for out in run.outcomes:
        _rebase(out, shift)
        if out.session is None:
            out.index = worker + out.index * workers
        else:
            out.session = worker + out.session * workers
    return replace(run, start=start)


def merge(parts: list[WorkerRun]) -> RunResult:
    """The workers' runs as one: every outcome, the window from the shared start to the last response."""
    first = parts[0].run
    start, started_at = first.start, first.started_at
    outcomes = [out for part in parts for out in part.run.outcomes]
    if any(out.session is not None for out in outcomes):
        outcomes.sort(key=lambda o: (o.dispatched, o.session, o.turn))
        for i, out in enumerate(outcomes):
            out.index = i
    else:
        outcomes.sort(key=lambda o: o.index)
    end = max((o.ended for o in outcomes if o.ended), default=start)
    return RunResult(outcomes, start, started_at, started_at + (end - start), end - start,
                     any(part.run.interrupted for part in parts),
                     [lag for part in parts for lag in part.run.loop_lags], min(part.run.ready_s for part in parts))


def worker_stats(worker: int, run: RunResult) -> dict:
    """One `per_worker` entry of a record: what this worker sent and how it kept its share of the schedule."""
    sent = [o for o in run.outcomes if o.dispatched > 0]
    verdict = judge(run.outcomes, run.start, loop_lags=run.loop_lags)
    return {
        "worker": worker,
        "requests": len(run.outcomes),
        "sent": len(sent),
        "completed": sum(1 for o in sent if o.ok),
        "failed": sum(1 for o in sent if o.error not in NOT_FAILURES),
        "scheduled_rate": verdict.scheduled_rate,
        "achieved_rate": verdict.achieved_rate,
        "send_lag_p99_ms": verdict.send_lag_p99_ms,
        "loop_lag_p99_ms": verdict.loop_lag_p99_ms,
        "ready_before_start_ms": run.ready_s * 1000.0,
    }


def workers_record(run: RunResult, parts: tuple[WorkerRun, ...], backend: str | None) -> dict:
    """`workers`, `worker_backend` and `per_worker` of a record; a run from one process is its only worker."""
    per_worker = [worker_stats(p.worker, p.run) for p in parts] or [worker_stats(0, run)]
    return {"workers": len(per_worker), "worker_backend": backend, "per_worker": per_worker}
