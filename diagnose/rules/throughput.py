"""`throughput.collapse`: gen throughput falls by a large factor and stays down at a similar running count.

On each rank's load lines in time order (never a line right after idle, whose window includes the idle time):
a collapse starts at a line where it and the next MIN_RUN - 1 lines all report less than 1/COLLAPSE_FACTOR of
the level before it (the 20th percentile of the BEFORE lines before it), at least 80% of the POST lines from it
stay below that, and the running batch (median over the same lines) is within SIMILAR_RUNNING of what it was:
the same work, done several times slower. Percentiles rather than means keep noise on either side from
making or hiding a collapse. The events between the last good line and the first slow one name the cause:
- a retraction or preemption: the pool ran out (SGLang: raise `--schedule-conservativeness`; vLLM: more KV
  memory with `--gpu-memory-utilization`);
- `cuda graph: True` before and `False` after: decode fell back to eager kernels (raise the captured maximum
  when the batch outgrew it);
- nothing in the log: no flag; the finding points at the line to look at.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.read.series import Rows
from toolkit.diagnose.rules.context import Context, memory_fraction, more_kv_memory, pow2_at_least
from toolkit.diagnose.vocabulary import Change

COLLAPSE_FACTOR = 3.0
MIN_RUN = 3
BEFORE = 20
POST = 20
SIMILAR_RUNNING = 0.25
SUSTAINED = 0.8  # this share of the POST lines below the level; the level is the BEFORE lines' 1 - SUSTAINED quantile


def check(ctx: Context) -> list[Finding]:
    load = ctx.timeline.load()
    load = load.where(~load["after_idle"].astype(bool) & np.isfinite(load["gen_throughput"]))
    if len(load) < BEFORE + POST:
        ctx.cannot_judge(f"{len(load)} {ctx.load_word} lines with a throughput (needs {BEFORE + POST})")
        return []
    found = []
    for rank in load.ranks:
        rows = load.of_rank(rank)
        onset = _onset(rows["gen_throughput"], rows["running_req"])
        if onset is not None:
            found.append((rank, rows, onset))
    if not found:
        return []
    rank, rows, onset = max(found, key=lambda f: _drop(f[1], f[2]))
    return [_finding(ctx, rank, rows, onset)]


def _onset(x: np.ndarray, running: np.ndarray) -> int | None:
    """Index of the first line where a collapse starts, None when there is none."""
    n = len(x)
    if n < BEFORE + POST:
        return None
    low = x < _max_before(x, BEFORE) / COLLAPSE_FACTOR
    run = low.copy()
    for k in range(1, MIN_RUN):
        run[:-k] &= low[k:]
        run[n - k:] = False
    run[:BEFORE] = False
    run[n - POST + 1:] = False
    candidates = np.flatnonzero(run)
    if not len(candidates):
        return None
    # NOTE: the conditions narrow the candidates one after another, cheapest first.
    level = np.quantile(_windows(x, BEFORE, after=False)[candidates], 1 - SUSTAINED, axis=1) / COLLAPSE_FACTOR
    first = np.max(_windows(x, MIN_RUN, after=True)[candidates], axis=1)
    keep = first < level
    candidates, level = candidates[keep], level[keep]
    if not len(candidates):
        return None
    post = np.quantile(_windows(x, POST, after=True)[candidates], SUSTAINED, axis=1)
    keep = post < level
    candidates = candidates[keep]
    if not len(candidates):
        return None
    run_pre = np.median(_windows(running, BEFORE, after=False)[candidates], axis=1)
    run_post = np.median(_windows(running, POST, after=True)[candidates], axis=1)
    similar = np.abs(run_post - run_pre) <= SIMILAR_RUNNING * np.maximum(run_pre, 1.0)
    hits = candidates[similar & (run_pre > 0)]
    return int(hits[0]) if len(hits) else None


def _max_before(x: np.ndarray, width: int) -> np.ndarray:
    """The largest of the `width` values before each line (-inf before the first), by doubling spans."""
    m = np.concatenate([np.full(width, -np.inf), np.where(np.isnan(x), -np.inf, x)])
    span = 1
    while span < width:
        step = min(span, width - span)
        m = np.maximum(m[:-step], m[step:])
        span += step
    return m[: len(x)]


def _windows(x: np.ndarray, width: int, after: bool) -> np.ndarray:
    """Row i: the `width` values before line i (`after=False`) or from line i on, NaN past either end."""
    pad = np.full(width, np.nan)
    padded = np.concatenate([x, pad]) if after else np.concatenate([pad, x])
    return sliding_window_view(padded, width)[: len(x)]


def _drop(rows: Rows, onset: int) -> float:
    x = rows["gen_throughput"]
    after = np.median(x[onset:onset + POST])
    return float(np.median(x[max(0, onset - BEFORE):onset]) / max(after, 1e-9))


def _finding(ctx: Context, rank: str, rows: Rows, onset: int) -> Finding:
    x, running, usage = rows["gen_throughput"], rows["running_req"], rows["usage"]
    before, after = slice(max(0, onset - BEFORE), onset), slice(onset, onset + POST)
    x_pre, x_post = float(np.median(x[before])), float(np.median(x[after]))
    r_pre, r_post = float(np.nanmedian(running[before])), float(np.nanmedian(running[after]))
    u_post = float(np.nanmedian(usage[after])) if np.isfinite(usage[after]).any() else None
    times, lines = rows["time"], rows["line"]
    cause, change, current, tradeoff = _cause(ctx, rank, rows, onset)
    pool = f", with the KV pool {u_post:.0%} used" if u_post is not None else ""
    where = f" on {rank}" if rank else ""
    collapsed = rows.where(np.arange(len(rows)) >= onset).head(POST)
    return Finding(
        id="throughput.collapse", severity="warning",
        title=f"Gen throughput collapsed {x_pre / max(x_post, 1e-9):.0f}x",
        message=f"Gen throughput fell from {x_pre:.0f} to {x_post:.0f} tok/s{where} at line {int(lines[onset])} while "
        f"the batch stayed at about {r_post:.0f} requests (was {r_pre:.0f}){pool}: the same work, done several times "
        f"slower. {cause}",
        evidence=evidence(collapsed, None, before_tok_s=round(x_pre, 1), after_tok_s=round(x_post, 1),
                 running_before=r_pre, running_after=r_post, usage_after=u_post,
                 onset_time=float(times[onset]) if np.isfinite(times[onset]) else None), change=change, current=current,
        tradeoff=tradeoff, ranks=(rank,))


def _cause(ctx: Context, rank: str, rows: Rows, onset: int) -> tuple[str, Change | None, Current | None, str | None]:
    """(sentence, change, current, trade-off) from what happened between the last good line and the first slow
    one."""
    cfg = ctx.config
    lines = rows["line"]
    start, stop = int(lines[onset - 1]), int(lines[min(onset + MIN_RUN - 1, len(rows) - 1)])
    between = [e for kind in ("retract", "preempt", "oom") for e in ctx.timeline.kind(kind)
               if start <= e.line <= stop and (e.rank == rank or not e.rank)]
    graph = rows["cuda_graph"]
    if between:
        what = "preemption" if cfg.vllm else "retraction"
        sentence = f"A {what} at line {between[0].line} came just before it."
        if cfg.vllm:
            more = more_kv_memory(cfg)
            if more is None:
                return (sentence + " The memory fraction is as high as advised: fewer requests at once avoid it.",
                        Change("running_cap", direction=-1), None, "A smaller batch: lower throughput at peak.")
            return (sentence, more, memory_fraction(cfg), "Less memory for activations and graphs.")
        current = cfg.schedule_conservativeness
        return (sentence + " Admitting less at once avoids running the pool out.",
                Change("admission", f"{round(max(1.3, current * 1.3), 1):g}"), Current.of(current),
                "A higher value admits fewer requests at once: lower peak batch.")
    if np.isfinite(graph[onset - 1]) and graph[onset - 1] == 1 and np.nanmax(graph[onset:onset + MIN_RUN]) == 0:
        cgmb = cfg.cuda_graph_max_bs
        p90 = float(np.nanquantile(rows["running_req"][onset:onset + POST], 0.9))
        sentence = f"Decode stopped using CUDA graphs at line {int(lines[onset])}."
        if cgmb and p90 > cgmb:
            return (sentence + f" The batch ({p90:.0f}) outgrew the captured maximum {cgmb}.",
                    Change("graph_max_bs", str(pow2_at_least(p90, 1024))), Current.of(cgmb),
                    "Graphs for larger batches take GPU memory.")
        return sentence + " Something other than the batch size turned them off.", None, None, None
    return (f"Nothing in the log explains it: look at what changed around line {int(lines[onset])}.",
            None, None, None)
