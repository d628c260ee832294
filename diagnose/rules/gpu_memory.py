"""GPU memory left (SGLang) after the KV pool and graphs (`available_gpu_mem`, else the last `avail mem=`).

- below 5 GB: `gpu_memory.too_little` (warning): activations and graphs may run out; lower
  `--mem-fraction-static`.
- 5-8 GB: good, no finding.
- 8-10 GB: `gpu_memory.spare` (info); 10 GB and more: `gpu_memory.too_much` (warning): memory that could
  hold KV cache is idle; raise `--mem-fraction-static`. Where the log's load shows the pool never held a request
  back (10 steady load lines or more, none with requests waiting at a full pool, no retraction), `too_much` is
  info without a flag: the memory is idle, and this load did not need it. Not where the engine runs in an RL
  trainer's processes on the same GPUs (`ServerConfig.colocated_with`, verl's `WorkerDict` actors): the memory it
  leaves is the trainer's.
The suggested value moves the leftover to ~6.5 GB: `mfs + (avail - 6.5) / gpu_mem`. Not judged on CPU.

Where graph capture began and its end is not in the log (an excerpt cut there, or a capture that failed), what is
left is at most what capture began with, and at least that less `GRAPH_ALLOWANCE_GB` (graphs take a few GB at
most): too little is judged on the first, spare or too much on the second. Where the log shows no capture line and
ends at the memory pool's end (no pool summary or batch line after it) with graphs on, the excerpt stops before the
capture: what start-up leaves is not in the log (sglang#3434: 15.85 GB at the pool's end of a TP16 start-up). A
piecewise CUDA-graph capture that began so (`Capturing num tokens (num_tokens=N ...`, sglang#14476) offers
`--piecewise-cuda-graph-max-tokens` N/2 too.

vLLM prints no leftover; its memory profile says what it may use (`total_gpu_memory (T) x gpu_memory_utilization
(U)`). The CUDA graphs it captures after allocating the KV cache live outside that budget: where graphs are on
and T x (1 - U) is below `GRAPH_ROOM_GB`, `gpu_memory.no_room_for_graphs` (info, low confidence: a forecast):
capture may run out of memory; a utilization that leaves `GRAPH_TARGET_GB` (or `--enforce-eager`).
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Evidence, Finding, evidence_events
from toolkit.diagnose.read.messages import CAPTURE_BEGAN
from toolkit.diagnose.rules.context import MIN_LINES, Context, capturing_at
from toolkit.diagnose.rules.room import waiting_at_full
from toolkit.diagnose.vocabulary import Change

LOW_GB = 5.0
GOOD_GB = 8.0
HIGH_GB = 10.0
TARGET_GB = 6.5
GRAPH_ALLOWANCE_GB = 4.0
GRAPH_ROOM_GB = 1.0  # vLLM: less than this outside its budget, and CUDA graphs may not fit
GRAPH_TARGET_GB = 2.0


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg.vllm:
        return _vllm_graph_room(ctx)
    failed = _capture_failed(ctx)
    avail = _left(cfg.available_mem_gb, cfg.before_graphs_gb, failed)
    if avail is None:
        if failed:
            ctx.cannot_judge("CUDA graph capture failed: what it would have left is not in the log")
        elif cfg.before_graphs_gb is None and cfg.engine is not None:
            ctx.cannot_judge("the memory left after start-up is not in the log")
        return []
    if cfg.device == "cpu" or LOW_GB <= avail <= GOOD_GB:
        return []
    mfs, total = cfg.mem_fraction_static, cfg.gpu_mem_gb
    if mfs is not None and total:
        change = Change("kv_memory", f"{min(0.95, max(0.3, mfs + (avail - TARGET_GB) / total)):.3f}")
    elif mfs is not None:
        change = Change("kv_memory", f"{mfs + (0.02 if avail > GOOD_GB else -0.02):.3f}")
    else:
        change = Change("kv_memory", direction=1 if avail > GOOD_GB else -1)
    facts = {"available_gb": avail, "gpu_mem_gb": total, "mem_fraction_static": mfs,
             "before_graphs_gb": cfg.before_graphs_gb}
    bound = "" if cfg.available_mem_gb is not None else (
        f" (capture began with {cfg.before_graphs_gb:.2f} GB and its end is not in the log: "
        f"{'at most' if avail < LOW_GB else 'at least'} this much is left)")
    ev = Evidence(count=1, lines=_startup_lines(ctx), facts=facts)
    current = Current.of(mfs) if mfs is not None else None
    if avail < LOW_GB:
        piecewise = _piecewise_tokens(ctx) if bound else None  # NOTE: judged where the capture began
        return [Finding(
            id="gpu_memory.too_little", severity="warning", title=f"Only {avail:.2f} GB GPU memory left after start-up",
            message=f"{avail:.2f} GB remain for activations, sampling and NCCL after the KV pool and graphs{bound} "
            f"(good: {LOW_GB:g}-{GOOD_GB:g} GB). Large prefills or batches can hit CUDA OOM."
            + (f" The capture was of piecewise CUDA graphs, from {piecewise} tokens down: fewer tokens take less "
               "memory." if piecewise else ""),
            evidence=ev, change=change, current=current,
            tradeoff="A smaller KV pool holds fewer tokens: fewer concurrent requests"
            + ("; smaller piecewise graphs run larger prefills without them." if piecewise else "."),
            alternatives=(Change("piecewise_max_tokens", str(piecewise // 2)),) if piecewise else ())]
    if cfg.colocated_with:
        ctx.cannot_judge(f"the engine runs in {cfg.colocated_with}'s trainer processes, on the same GPUs: the memory "
                         "it leaves free is the trainer's")
        return []
    unpressed = _pool_never_limited(ctx)
    if unpressed is not None:
        return [Finding(
            id="gpu_memory.too_much", severity="info", title=f"{avail:.2f} GB GPU memory left unused, not needed here",
            message=f"{avail:.2f} GB stay free after the KV pool and graphs{bound} (good: {LOW_GB:g}-{GOOD_GB:g} GB), "
            f"but this log's load never waited for the pool ({unpressed}): a larger pool serves more concurrent "
            f"requests only under more load than this ({cfg.flag('kv_memory')} then).",
            evidence=ev, change=None, current=current, tradeoff="")]
    severity = "warning" if avail >= HIGH_GB else "info"
    return [Finding(
        id="gpu_memory.too_much", severity=severity,
        title=f"{'' if not bound else 'At least '}{avail:.2f} GB GPU memory left unused",
        message=f"{avail:.2f} GB stay free after the KV pool and graphs{bound} (good: {LOW_GB:g}-{GOOD_GB:g} GB); the "
        "KV pool could be larger and hold more concurrent requests.", evidence=ev, change=change, current=current,
        tradeoff="Less headroom for activations: too high a value risks CUDA OOM on the largest prefill.")]


def _pool_never_limited(ctx: Context) -> str | None:
    """How the load shows the pool never held a request back (MIN_LINES steady load lines or more, none with requests
    waiting at a pool with no room for the next, no retraction), or None where it did or the log cannot tell. A log
    with no load line at all and MIN_LINES prefill lines or more (a PD prefill server prints no decode line) is read
    on its prefill lines."""
    rows, word = ctx.steady(), f"steady {ctx.load_word}"
    if not len(ctx.timeline.load()):
        rows, word = ctx.timeline.series("prefill"), "prefill"
    if len(rows) < MIN_LINES or "queue_req" not in rows or "usage" not in rows:
        return None
    if waiting_at_full(rows, ctx.config.max_total_num_tokens).any() or ctx.timeline.kind("retract"):
        return None
    return f"{len(rows)} {word} lines, none with requests waiting at a full pool, no retraction"


def _vllm_graph_room(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    profiles = [e for e in ctx.timeline.kind("memory_profile")
                if isinstance(e.fields.get("total_gpu_memory_gb"), float)
                and isinstance(e.fields.get("gpu_memory_utilization"), float)]
    if not profiles:
        ctx.cannot_judge("the memory left after start-up is not in the log (vLLM does not print it; see its KV "
                         "cache size)")
        return []
    if cfg.device == "cpu" or cfg.value("graphs_off") is True:
        return []
    e = profiles[-1]
    if any(g.source == e.source and g.line > e.line for g in ctx.timeline.kind("graph_captured")):
        return []  # NOTE: the log shows the capture done: it fitted
    total = float(e.fields["total_gpu_memory_gb"])  # type: ignore[arg-type]
    util = float(e.fields["gpu_memory_utilization"])  # type: ignore[arg-type]
    outside = total * (1 - util)
    if outside >= GRAPH_ROOM_GB:
        return []
    suggested = int((1 - GRAPH_TARGET_GB / total) * 100) / 100
    if suggested <= 0 or suggested >= util:
        return []
    return [Finding(
        id="gpu_memory.no_room_for_graphs", severity="info",
        title=f"{outside:.2f} GiB left outside vLLM's memory budget",
        message=f"gpu_memory_utilization {util:g} of {total:.2f} GiB leaves {outside:.2f} GiB outside what vLLM "
        "profiles; the CUDA graphs it captures after allocating the KV cache need room there (a GiB or more for large "
        "models and many batch sizes), so capture may run out of memory.",
        evidence=evidence_events([e], total_gpu_memory_gb=total, gpu_memory_utilization=util,
                                 outside_gb=round(outside, 2)),
        change=Change("kv_memory", f"{suggested:.2f}"), current=Current.of(util),
        tradeoff="A smaller KV cache holds fewer tokens; eager mode instead keeps the cache but decodes slower.",
        ranks=tuple(sorted({e.rank for e in profiles if e.rank})), alternatives=(Change("graphs_off", True),),
        confidence="low")]


def _left(after_graphs: float | None, before_graphs: float | None, failed: bool) -> float | None:
    """The memory left to judge: after graphs where the log says it; else, from what capture began with, a
    figure below LOW_GB (at most that much is left) or, where the capture did not fail (the excerpt is cut), above
    GOOD_GB (at least that much); None otherwise."""
    if after_graphs is not None or before_graphs is None:
        return after_graphs
    if before_graphs < LOW_GB:
        return before_graphs
    least = before_graphs - GRAPH_ALLOWANCE_GB
    return least if least > GOOD_GB and not failed else None


def _capture_failed(ctx: Context) -> bool:
    """An error while CUDA graphs were being captured (`capturing_at`): the capture failed (a crash rule says why)."""
    errors = (e for kind in ("graph_failed", "oom", "exception") for e in ctx.timeline.kind(kind))
    return any(capturing_at(ctx, e) for e in errors)


def _startup_lines(ctx: Context) -> tuple[int, ...]:
    for kind in ("pool", "graph_end", "pool_end", *CAPTURE_BEGAN):
        rows = ctx.timeline.kind(kind)
        if rows:
            return (rows[0].line,)
    return ()


def _piecewise_tokens(ctx: Context) -> int | None:
    """The largest token count (2 or more) of the last capture's piecewise CUDA graphs (`Capturing num tokens
    (num_tokens=N`, sglang#14476: the sizes are captured largest first; the last capture: its bars after the last
    capture's end), None where it captured batch sizes."""
    tl = ctx.timeline
    ended = max((e.line for e in tl.kind("graph_end")), default=-1)
    bars = [e for e in tl.kind("graph_progress") if e.line > ended]
    if not bars or not isinstance(bars[-1].fields.get("num_tokens"), int):
        return None
    largest = max(int(n) for e in bars if isinstance(n := e.fields.get("num_tokens"), int))
    return largest if largest >= 2 else None
