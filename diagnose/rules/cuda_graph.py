"""`cuda_graph.not_used`: steady decode batches ran without a CUDA graph.

Trigger: >= 20% of steady decode lines that print `cuda graph:` say False (0.4.9+). If their batches are
larger than `cuda_graph_max_bs`, suggest raising it to cover the p90 batch (power of two, <= 1024) and
lowering `--mem-fraction-static` by 0.02 per doubling to pay for the graphs. With `--disable-cuda-graph`
(any era) and a median steady batch <= 256, suggest enabling graphs. Not judged on CPU.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_least, ranks_of

OFF_FRACTION = 0.2
MAX_SUGGESTED_BS = 1024
DISABLED_MEDIAN_BS = 256


def check(ctx: Context) -> list[Finding]:
    steady = ctx.steady()
    if len(steady) < MIN_LINES or not ctx.config.on_gpu:
        return []
    if ctx.config.cuda_graph_disabled:
        return _disabled(ctx, steady)
    if "cuda_graph" not in steady:
        return []
    printed = steady[steady["cuda_graph"].isin([True, False])]
    off = printed[printed["cuda_graph"] == False]  # noqa: E712 - a column of bools
    if len(printed) < MIN_LINES or len(off) / len(printed) < OFF_FRACTION:
        return []
    cgmb = ctx.config.cuda_graph_max_bs
    p90 = float(off["running_req"].quantile(0.9))
    frac = len(off) / len(printed)
    if cgmb and p90 > cgmb:
        target = pow2_at_least(p90, MAX_SUGGESTED_BS)
        doublings = max(1, int(np.log2(target / cgmb)))
        mfs = ctx.config.mem_fraction_static
        extra = f" and --mem-fraction-static {mfs - 0.02 * doublings:.2f}" if mfs else ""
        return [Finding(
            "cuda_graph.not_used", "warning", "Decode ran without CUDA graphs",
            f"{frac:.0%} of {len(printed)} steady decode lines ran without a graph; their batches "
            f"(p90 {p90:.0f} requests) exceed cuda_graph_max_bs={cgmb}. Graphs remove launch overhead.",
            evidence(off, len(printed), p90_running=p90, cuda_graph_max_bs=cgmb),
            "--cuda-graph-max-bs", f"{target}{extra}", str(cgmb),
            "Graphs for larger batches take GPU memory (less KV pool) and start-up time.", ranks_of(off))]
    return [Finding(
        "cuda_graph.not_used", "warning", "Decode ran without CUDA graphs within the capture range",
        f"{frac:.0%} of {len(printed)} steady decode lines ran without a graph although their batches "
        f"(p90 {p90:.0f}) are within cuda_graph_max_bs={cgmb}: another feature (speculative decoding, "
        "mixed chunks, a backend) disabled them for these steps.",
        evidence(off, len(printed), p90_running=p90, cuda_graph_max_bs=cgmb),
        None, None, str(cgmb) if cgmb else None, None, ranks_of(off))]


def _disabled(ctx: Context, steady) -> list[Finding]:
    median = float(steady["running_req"].median())
    if median > DISABLED_MEDIAN_BS:
        return []
    return [Finding(
        "cuda_graph.disabled", "warning", "CUDA graphs are disabled",
        f"--disable-cuda-graph is set while the median steady batch is {median:.0f} requests; small decode "
        "batches are launch-bound and graphs speed them up.",
        evidence(steady, len(steady), median_running=median), "--disable-cuda-graph", "remove (graphs on)",
        "set", "Graph capture takes start-up time and some GPU memory.", ranks_of(steady))]
