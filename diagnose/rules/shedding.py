"""Load shedding (docs/log-formats.md §6.4): the server refused or timed out requests with 503, or never did
while its clients gave up.

- `shedding.too_much`: at least MIN_SHED requests shed, and either SHED_SHARE of the requests that came in
  (shed + admitted, admitted counted by the prefill lines' `#new-seq`) or a sustained run: shed lines no more
  than RUN_GAP_S apart for at least SUSTAINED_S. Capacity is short: add a replica, or raise the running cap when
  the batch is pinned at it and the KV pool has room.
- `shedding.no_queue_cap`: nothing shed, no `--max-queued-requests` in the server arguments, and clients gave up
  (at least MIN_GONE disconnects) or the queue grew without bound (each quarter's median queue at least the one
  before, the last at least GROWTH x the first and GROWING_QUEUE, never empty in the second half). A capped queue
  answers 503 at once, which clients retry, instead of a wait they time out of.

A timed-out request is written twice (the front end's `Shed` summary and the scheduler's `Queue timeout`): the
larger of the two counts is taken, never their sum.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from toolkit.diagnose.findings import Current, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.rules.running_cap import supported_cap
from toolkit.diagnose.vocabulary import Change

MIN_SHED = 10
SHED_SHARE = 0.05
RUN_GAP_S = 30.0       # `toolkit serve` writes a shed summary every 10 s while shedding goes on
SUSTAINED_S = 60.0
KV_ROOM = 0.8          # median KV usage below this: the pool has room for a larger batch
PINNED = 0.9           # the median batch at this share of the running cap: the cap binds
MIN_GONE = 3
GROWTH = 2.0
GROWING_QUEUE = 64


class Shed(NamedTuple):
    """Requests shed over the log: refused at admission (`queue_full`) and timed out waiting, with their lines."""

    queue_full: int
    waiting_timeout: int
    events: list[Event]

    @property
    def total(self) -> int:
        return self.queue_full + self.waiting_timeout


def shed_of(ctx: Context) -> Shed:
    summaries, timeouts = ctx.timeline.kind("shed"), ctx.timeline.kind("queue_timeout")
    queue_full = sum(_count(e, "queue_full") for e in summaries)
    # NOTE: both lines count the same timed-out requests; the summary may still be pending when the log ends.
    waiting = max(sum(_count(e, "waiting_timeout") for e in summaries), sum(_count(e, "aborted") for e in timeouts))
    events = sorted(summaries + timeouts, key=lambda e: (e.source, e.line))
    return Shed(queue_full, waiting, events)


def _count(event: Event, name: str) -> int:
    v = event.fields.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def check(ctx: Context) -> list[Finding]:
    shed = shed_of(ctx)
    found = _too_much(ctx, shed) if shed.events else _no_queue_cap(ctx)
    return [found] if found is not None else []


# -- shedding.too_much ----------------------------------------------------------------------------------------

def admitted(ctx: Context) -> int | None:
    """Requests the scheduler admitted: the prefill lines' `#new-seq` summed, None without them."""
    prefill = ctx.timeline.series("prefill")
    if "new_seq" not in prefill:
        return None
    return int(np.nansum(prefill["new_seq"]))


def longest_run(times: list[float]) -> float:
    """Seconds of the longest run of times no more than RUN_GAP_S apart."""
    times = sorted(times)
    best, start = 0.0, 0
    for i in range(1, len(times)):
        if times[i] - times[i - 1] > RUN_GAP_S:
            start = i
        best = max(best, times[i] - times[start])
    return best


def _too_much(ctx: Context, shed: Shed) -> Finding | None:
    came_in = admitted(ctx)
    share = shed.total / (shed.total + came_in) if came_in else None
    run = longest_run([e.time for e in shed.events if e.time is not None])
    sustained = run >= SUSTAINED_S
    if shed.total < MIN_SHED or not ((share is not None and share >= SHED_SHARE) or sustained):
        return None
    of_all = f", {share:.0%} of the {shed.total + came_in} requests that came in" if came_in else ""
    why = f"shedding went on for {run:.0f} s without a break of {RUN_GAP_S:.0f} s" if sustained else \
        "more than a burst explains"
    change, alternatives, current, tradeoff = _capacity_change(ctx)
    return Finding(
        id="shedding.too_much", severity="warning", title="The server shed load: capacity is short",
        message=f"The server answered {shed.total} requests with 503 ({shed.queue_full} refused with a full queue, "
        f"{shed.waiting_timeout} timed out waiting){of_all}: {why}. Clients retry them into the same queue; the "
        "offered load is above what this server runs.",
        evidence=evidence_events(shed.events, shed=shed.total, queue_full=shed.queue_full,
                        waiting_timeout=shed.waiting_timeout, admitted=came_in,
                        share=round(share, 3) if share is not None else None, longest_run_s=round(run, 1)),
        change=change, alternatives=alternatives, current=current, tradeoff=tradeoff,
        action="or more workers behind a router (sglang-router)" if change is not None
        else "more hosts, each its own server, behind a router (sglang-router)",
    )


def _capacity_change(ctx: Context) -> tuple[Change | None, tuple[Change, ...], Current | None, str]:
    """(change, alternatives, current, trade-off): a larger running cap when the batch is pinned at it and the KV
    pool has room, else one more replica (`--dp-size`) on a GPU server; on a CPU the replicas would share the same
    cores, so nothing on the server (more hosts behind a router)."""
    cfg = ctx.config
    replicas = (Change("dp", str(cfg.dp_size * 2)),) if cfg.on_gpu else ()
    raised = _raised_cap(ctx)
    if raised is not None:
        cap = cfg.max_running_requests
        return (Change("running_cap", str(raised)), replicas, Current.of(cap),  # type: ignore[arg-type]
                "A larger batch raises each request's time per output token.")
    if not replicas:
        return None, (), None, "Replicas on the same CPU share its cores: capacity comes from more hosts."
    return replicas[0], (), Current.of(cfg.dp_size), "Another replica needs its own GPUs."


def _raised_cap(ctx: Context) -> int | None:
    cap, load = ctx.config.max_running_requests, ctx.load_or_none()
    if cap is None or load is None:
        return None
    usage, running = load.median("usage"), load.median("running_req")
    if not (usage < KV_ROOM and running >= PINNED * cap and usage > 0):
        return None
    # NOTE: no demand bound: the shed requests wanted to run too, and the visible queue stops at its cap
    return supported_cap(cap, usage, demand=None)


# -- shedding.no_queue_cap ------------------------------------------------------------------------------------

def unbounded_queue(load: Rows) -> tuple[float, float] | None:
    """(first quarter's median queue, last quarter's) when the queue grew without bound, else None."""
    ok = np.isfinite(load["queue_req"])
    queue, times = load["queue_req"][ok], load["time"][ok]
    if len(queue) < MIN_LINES:
        return None
    if np.isfinite(times).all():
        queue = queue[np.argsort(times, kind="stable")]
    quarters = [float(np.median(part)) for part in np.array_split(queue, 4)]
    growing = all(b >= a for a, b in zip(quarters, quarters[1:]))
    first, last = quarters[0], quarters[-1]
    never_empty = bool((queue[len(queue) // 2:] > 0).all())
    if growing and never_empty and last >= GROWING_QUEUE and last >= GROWTH * max(first, 1.0):
        return first, last
    return None


def _no_queue_cap(ctx: Context) -> Finding | None:
    if ctx.config.max_queued_requests is not None:
        return None
    gone, load = ctx.timeline.kind("client_gone"), ctx.load_or_none()
    growth = unbounded_queue(load) if load is not None else None
    gave_up = len(gone) >= MIN_GONE
    if not gave_up and growth is None:
        return None
    signs = [f"{len(gone)} clients disconnected before their response"] if gave_up else []
    if growth is not None:
        signs.append(f"the queue grew from {growth[0]:.0f} to {growth[1]:.0f} requests (medians of the first and "
                     "last quarter of the log) and never emptied")
    running = load.median("running_req") if load is not None else float("nan")
    batch = max(1, int(round(running))) if np.isfinite(running) else None
    facts = dict(disconnects=len(gone), first_quarter_queue=growth[0] if growth else None,
                 last_quarter_queue=growth[1] if growth else None, median_running=batch)
    if gave_up or load is None:
        proof, confidence = evidence_events(gone, **facts), "high"
    else:
        proof, confidence = evidence(load, len(load), **facts), confidence_of(len(load), MIN_LINES * 3)
    finding = Finding(
        id="shedding.no_queue_cap", severity="warning" if gave_up else "info",
        title="Clients gave up on an uncapped queue",
        message=f"Nothing was shed while {' and '.join(signs)}: without a queue cap every request waits, however long "
        "the queue, until its client gives up. ", evidence=proof,
        alternatives=(Change("dp", str(ctx.config.dp_size * 2)),),
        tradeoff="Requests beyond the cap get 503 at once and are retried; none waits past its client.",
        ranks=load.ranks if load is not None and growth else (), confidence=confidence)
    return _vllm_cap(finding) if ctx.config.vllm else _sglang_cap(finding, batch, bool(ctx.config.args))


def _sglang_cap(finding: Finding, batch: int | None, args_logged: bool) -> Finding:
    about = f" at about one running batch ({batch} requests: a request then waits about one request's time)" \
        if batch else ""
    return replace(finding, message=finding.message + f"Cap the waiting queue{about}; with `toolkit serve`, "
                   "--queue-timeout also frees requests that waited too long.",
                   change=Change("max_queued", str(batch)) if batch else Change("max_queued"),
                   current=Current("not set" if args_logged else "not in the log (no server_args line)", None))


def _vllm_cap(finding: Finding) -> Finding:
    return replace(finding, message=finding.message + "vLLM has no waiting-queue cap: cap the queue in the router "
                   "or gateway in front of it, or add replicas.",
                   action="cap the queue in front of the server (router / gateway)")
