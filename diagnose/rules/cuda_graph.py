"""CUDA graphs: steady decode batches that ran without one, and what capturing them cost. Not judged on CPU.

- `cuda_graph.not_used`: >= 20% of steady decode lines that print `cuda graph:` (SGLang 0.4.9+) say False. If
  their batches are larger than `cuda_graph_max_bs`, suggest raising it to cover the p90 batch (power of two,
  <= 1024) and lowering `--mem-fraction-static` by 0.02 per doubling to pay for the graphs. A short excerpt (too
  few steady lines) gets it when its lines split by batch (every step without a graph larger than every step
  with one), at the confidence its lines carry; or when its lines print False and none True (one is enough,
  sglang#29853: an NPU decode line at 128 running), at batches up to 256 (mineru#3470: 20 running; graphs off,
  or captured below the batch), without speculative decoding's figures (its steps may run eagerly by design,
  sglang#25960): the maximum that covers the largest batch, or graphs on (`--disable-cuda-graph` off).
- `cuda_graph.ceiling`: the lines do not say (older SGLang, vLLM), but the running batch sits above the
  captured maximum in >= 50% of steady load lines: those steps run eagerly. Suggest raising the maximum to
  cover the p90 batch (vLLM `--max-cudagraph-capture-size`, default 512).
- `cuda_graph.below_cap` (info, low confidence): a start-up without load lines whose capture lists its batch sizes
  (`bs=[1, ..., 32]`) below a quarter of the running cap and below 256 (where graphs matter most; sglang#33483: 32
  against 4096): steps above the largest graph would run eagerly; suggest the next power of two above twice it.
- `cuda_graph.disabled`: graphs are off (`--disable-cuda-graph`, vLLM `--enforce-eager`) and the median steady
  batch is <= 256: suggest turning them on. A short excerpt (too few steady lines) gets it from its load lines
  with requests running, at the confidence they carry (llama.cpp#11474: a pasted `--enforce-eager` launch, one
  request at 32 tok/s).
- `cuda_graph.capture_memory`: capturing took >= 1 GB and more than what is left: SGLang's `mem usage` of the
  captures against the `avail mem` after them; vLLM's `Graph capturing ... took X GiB` against >= 20% of the
  KV cache memory. Suggest half the captured maximum.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from toolkit.diagnose.findings import Current, Evidence, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_least
from toolkit.diagnose.vocabulary import Change

OFF_FRACTION = 0.2
CEILING_FRACTION = 0.5
MAX_SUGGESTED_BS = 1024
BELOW_CAP_FACTOR = 4  # a running cap this many times the largest graph: most of its range runs eagerly
DISABLED_MEDIAN_BS = 256
MIN_GRAPH_GB = 1.0
VLLM_GRAPH_SHARE = 0.2


def check(ctx: Context) -> list[Finding]:
    if not ctx.config.on_gpu:
        return []
    out = _capture_memory(ctx)
    steady = ctx.steady_enough()
    if steady is None:
        if ctx.config.cuda_graph_disabled:
            return out + _disabled_short(ctx)
        return out + _not_used_short(ctx) + _below_cap(ctx)
    if ctx.config.cuda_graph_disabled:
        return out + _disabled(ctx, steady)
    if "cuda_graph" in steady:
        return out + _not_used(ctx, steady)
    return out + _ceiling(ctx, steady)


def _not_used(ctx: Context, steady) -> list[Finding]:
    graph = steady["cuda_graph"]
    printed = steady.where(np.isfinite(graph))
    off = printed.where(printed["cuda_graph"] == 0)
    if len(printed) < MIN_LINES or len(off) / len(printed) < OFF_FRACTION:
        return []
    cgmb = ctx.config.cuda_graph_max_bs
    p90 = off.quantile("running_req", 0.9)
    frac = len(off) / len(printed)
    if cgmb and p90 > cgmb:
        target = pow2_at_least(p90, MAX_SUGGESTED_BS)
        doublings = max(1, int(np.log2(target / cgmb)))
        mfs = ctx.config.mem_fraction_static
        pay = (Change("kv_memory", f"{mfs - 0.02 * doublings:.2f}"),) if mfs else ()
        return [Finding(
            id="cuda_graph.not_used", severity="warning", title="Decode ran without CUDA graphs",
            message=f"{frac:.0%} of {len(printed)} steady decode lines ran without a graph; their batches "
            f"(p90 {p90:.0f} requests) exceed cuda_graph_max_bs={cgmb}. Graphs remove launch overhead.",
            evidence=evidence(off, len(printed), p90_running=p90, cuda_graph_max_bs=cgmb),
            change=Change("graph_max_bs", str(target), companions=pay), current=Current.of(cgmb),
            tradeoff="Graphs for larger batches take GPU memory (less KV pool) and start-up time.", ranks=off.ranks)]
    return [Finding(
        id="cuda_graph.not_used", severity="warning", title="Decode ran without CUDA graphs within the capture range",
        message=f"{frac:.0%} of {len(printed)} steady decode lines ran without a graph although their batches "
        f"(p90 {p90:.0f}) are within cuda_graph_max_bs={cgmb}: another feature (speculative decoding, "
        "mixed chunks, a backend) disabled them for these steps.",
        evidence=evidence(off, len(printed), p90_running=p90, cuda_graph_max_bs=cgmb),
        change=None, current=Current.of(cgmb) if cgmb else None, tradeoff=None, ranks=off.ranks)]


ALL_OFF_LINES = 1  # one decode line that says False is a step that ran eagerly (sglang#29853: at 128 running)
SPECULATIVE = "accept"  # in the name of what a decode line of speculative decoding prints (`accept len`, `accept
# rate`, `block accept len`; a paste that cut `token usage: ..., accept rate` into `token usaccept rate`, sglang#25960)


def _not_used_short(ctx: Context) -> list[Finding]:
    """A short excerpt (too few steady lines) whose `cuda graph:` lines split by batch: every step without a graph
    ran more requests than every step with one, so the capture's maximum lies between (sglang#13023: False at 46
    and 36 running, True from 28 down). Confidence by the lines that print the field."""
    load = ctx.load_or_none()
    if load is None or "cuda_graph" not in load or "running_req" not in load:
        return []
    printed = load.where(np.isfinite(load["cuda_graph"]) & np.isfinite(load["running_req"]))
    off, on = printed.where(printed["cuda_graph"] == 0), printed.where(printed["cuda_graph"] == 1)
    if len(off) >= ALL_OFF_LINES and not len(on):
        return _all_off(ctx, off)
    if not len(off) or not len(on):
        return []
    largest_on, smallest_off = float(np.max(on["running_req"])), float(np.min(off["running_req"]))
    if smallest_off <= largest_on:
        return []
    return [_short_not_used(
        ctx, off, len(printed),
        f"In a short excerpt, the {len(off)} decode steps without a graph ran {smallest_off:.0f} requests or more "
        f"and the {len(on)} with one at most {largest_on:.0f}: graphs were captured up to a batch between them.",
        {"largest_with_graph": largest_on, "smallest_without": smallest_off})]


def _all_off(ctx: Context, off) -> list[Finding]:
    """A short excerpt whose every line says `cuda graph: False` at batches up to DISABLED_MEDIAN_BS: graphs off,
    or captured below them (so turning them on is the alternative)."""
    largest = float(np.max(off["running_req"]))
    if largest > DISABLED_MEDIAN_BS or largest < 1 or _speculative(off):
        return []  # NOTE: speculative decoding may run its steps without a graph by itself (the long path says so)
    steps = (f"the one decode step that says so ran without a CUDA graph, at a batch of {largest:.0f} requests: "
             "graphs are off, or captured only below this batch" if len(off) == 1 else
             f"every one of the {len(off)} decode steps that say so ran without a CUDA graph, at batches up to "
             f"{largest:.0f} requests: graphs are off, or captured only below these batches")
    return [_short_not_used(ctx, off, len(off), f"In a short excerpt, {steps}.", {"largest_without": largest},
                            (Change("graphs_off", False),))]


def _speculative(rows) -> bool:
    """Whether these decode lines print speculative decoding's acceptance."""
    return any(SPECULATIVE in name and name in rows for name in rows.table.columns)


def _short_not_used(ctx: Context, off, printed: int, what: str, facts: dict[str, float],
                    alternatives: tuple[Change, ...] = ()) -> Finding:
    """`cuda_graph.not_used` for a short excerpt: the maximum that covers its largest batch without a graph, at the
    confidence its `printed` lines carry."""
    cfg = ctx.config
    target = pow2_at_least(float(np.max(off["running_req"])), MAX_SUGGESTED_BS)
    confidence = confidence_of(printed, MIN_LINES)
    return Finding(
        id="cuda_graph.not_used", severity="info" if confidence == "low" else "warning",
        title="Decode ran without CUDA graphs", message=f"{what} Graphs remove launch overhead.",
        evidence=evidence(off, printed, **facts), change=Change("graph_max_bs", str(target)),
        current=Current.of(cfg.cuda_graph_max_bs) if cfg.cuda_graph_max_bs_known else None,
        tradeoff="Graphs for larger batches take GPU memory (less KV pool) and start-up time.", ranks=off.ranks,
        alternatives=alternatives, confidence=confidence)


def _below_cap(ctx: Context) -> list[Finding]:
    """A start-up without any load line whose capture lists its batch sizes (`bs=[1, ..., 32]`) far below the running
    cap (sglang#33483: graphs to 32, `max_running_requests=4096`): batches above the largest graph would run eagerly;
    whether they get there, no line shows. Low confidence; the next power of two above twice the graphs."""
    cfg = ctx.config
    captured, cap = cfg.captured_max_bs, cfg.max_running_requests
    if (ctx.load_or_none() is not None or captured is None or cap is None or captured >= DISABLED_MEDIAN_BS
            or cap < BELOW_CAP_FACTOR * captured):
        return []
    begins = [e for e in ctx.timeline.kind("graph_begin") if e.fields.get("captured_bs") == captured]
    target = pow2_at_least(min(cap, 2 * captured), MAX_SUGGESTED_BS)
    return [Finding(
        id="cuda_graph.below_cap", severity="info", title="CUDA graphs stop far below the running cap",
        message=f"Graphs were captured for batches up to {captured} requests while up to {cap} may run: every decode "
        f"step above {captured} runs without a graph and pays the launch overhead. No load line shows how large the "
        "batch grows; check `#running-req` under load.",
        evidence=evidence_events(begins, captured_max=captured, max_running_requests=cap),
        change=Change("graph_max_bs", str(target)), current=Current.of(captured),
        tradeoff="Graphs for larger batches take GPU memory (a smaller KV cache) and start-up time.",
        ranks=tuple(sorted({e.rank for e in begins if e.rank})), confidence="low")]


def _ceiling(ctx: Context, steady) -> list[Finding]:
    cgmb = ctx.config.cuda_graph_max_bs
    if not cgmb:
        ctx.cannot_judge("the captured maximum batch is not known")
        return []
    above = steady.where(steady["running_req"] > cgmb)
    fraction = len(above) / len(steady)
    if fraction < CEILING_FRACTION:
        return []
    p90 = steady.quantile("running_req", 0.9)
    target = pow2_at_least(p90, MAX_SUGGESTED_BS)
    if target <= cgmb:
        return []
    known = "" if ctx.config.cuda_graph_max_bs_known else " (the default)"
    return [Finding(
        id="cuda_graph.ceiling", severity="warning", title="Running batch above the CUDA-graph ceiling",
        message=f"In {fraction:.0%} of {len(steady)} steady {ctx.load_word} lines the batch ran more than {cgmb} "
        f"requests, the largest captured graph{known}: those steps run without graphs and pay the launch overhead.",
        evidence=evidence(above, len(steady), p90_running=p90, captured_max=cgmb),
        change=Change("graph_max_bs", str(target)), current=Current.of(cgmb),
        tradeoff="Graphs for larger batches take GPU memory (a smaller KV cache) and start-up time.",
        ranks=above.ranks)]


def _disabled(ctx: Context, steady, which: str = "steady batch") -> list[Finding]:
    median = steady.median("running_req")
    if median > DISABLED_MEDIAN_BS:
        return []
    name = ctx.config.flag("graphs_off")
    return [Finding(
        id="cuda_graph.disabled", severity="warning", title="CUDA graphs are disabled",
        message=f"{name} is set while the median {which} is {median:g} request{'' if median == 1 else 's'}; small "
        "decode batches are launch-bound and graphs speed them up.",
        evidence=evidence(steady, len(steady), median_running=median), change=Change("graphs_off", False),
        current=Current(value=True, said="set"), tradeoff="Graph capture takes start-up time and some GPU memory.",
        ranks=steady.ranks)]


def _disabled_short(ctx: Context) -> list[Finding]:
    load = ctx.load_or_none()
    running = load.where(load["running_req"] >= 1) if load is not None and "running_req" in load else None
    if running is None or not len(running):
        return []
    found = _disabled(ctx, running, f"batch of the {len(running)} load lines with requests running")
    confidence = confidence_of(len(running), MIN_LINES)
    return [replace(f, confidence=confidence, severity="info" if confidence == "low" else f.severity) for f in found]


def _capture_memory(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    graphs = cfg.graph_mem_gb
    left = cfg.kv_mem_gb * VLLM_GRAPH_SHARE if cfg.vllm and cfg.kv_mem_gb else (
        None if cfg.vllm else cfg.available_mem_gb)
    if graphs is None or left is None:
        return []
    if graphs < MIN_GRAPH_GB or graphs <= left:
        return []
    cgmb = cfg.cuda_graph_max_bs
    rows = ctx.timeline.kind("graph_end" if not cfg.vllm else "graph_captured")
    against = (f"{VLLM_GRAPH_SHARE:.0%} of the {cfg.kv_mem_gb:.2f} GB KV cache" if cfg.vllm
               else f"the {left:.2f} GB left after them")
    return [Finding(
        id="cuda_graph.capture_memory", severity="warning", title=f"CUDA graphs took {graphs:.2f} GB",
        message=f"Capturing the decode graphs took {graphs:.2f} GB, more than {against}: memory the KV cache or "
        "activations could use. Fewer captured batch sizes take less.",
        evidence=Evidence(count=len(rows), total=None, span=None, lines=tuple(e.line for e in rows[:5]),
                 facts={"graph_gb": graphs, "left_gb": cfg.available_mem_gb, "kv_cache_gb": cfg.kv_mem_gb}),
        change=Change("graph_max_bs", str(max(1, cgmb // 2)) if cgmb else None),
        current=Current.of(cgmb) if cgmb else None,
        tradeoff="Batches above the smaller maximum run without graphs (slower decode steps for them).")]
