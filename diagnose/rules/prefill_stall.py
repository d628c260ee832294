"""`prefill_stall.throughput_dips`: decode throughput collapses while prefills run (SGLang).

Trigger: >= 15% of steady decode lines (never the first line after idle, whose window includes the idle
time) report gen throughput below half the steady median, and the estimated prefill share of steady time
is >= 30%. Smaller prefill chunks interleave with decode; mixed chunks let decode ride along. A smaller chunk
only helps where it would cut the prefill batches: where the prefill lines' new tokens (their 90th percentile)
already fit the suggested chunk, no chunk changes the stall (short prompts at low load: no finding). vLLM's stats
lines average ten seconds and print no prefill lines, so it is not judged there.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context
from toolkit.diagnose.timeline import prefill_time_share
from toolkit.diagnose.vocabulary import Change

DIP = 0.5
DIP_FRACTION = 0.15
PREFILL_SHARE = 0.3
MIN_CHUNK = 1024
BATCH_QUANTILE = 0.9


def check(ctx: Context) -> list[Finding]:
    if ctx.config.vllm:
        return []
    steady = ctx.steady()
    steady = steady.where(~steady["after_idle"].astype(bool))
    throughput = steady["gen_throughput"]
    if len(steady) < MIN_LINES or np.isnan(throughput).all():
        ctx.cannot_judge(f"{len(steady)} steady decode lines with a throughput (needs {MIN_LINES})")
        return []
    median = steady.median("gen_throughput")
    dips = steady.where(throughput < DIP * median)
    if len(dips) / len(steady) < DIP_FRACTION:
        return []
    shares = [s for s in (prefill_time_share(ctx.timeline, r) for r in ctx.timeline.ranks) if s is not None]
    share = max(shares) if shares else None
    if share is None or share < PREFILL_SHARE:
        return []
    chunk = ctx.config.chunked_prefill_size
    suggested = str(max(MIN_CHUNK, chunk // 2)) if chunk else "4096"
    prefill = ctx.timeline.series("prefill")
    if len(prefill) and "new_token" in prefill and not prefill.quantile("new_token", BATCH_QUANTILE) > int(suggested):
        return []  # NOTE: the batches already fit the suggested chunk: it would cut nothing
    return [Finding(
        id="prefill_stall.throughput_dips", severity="warning", title="Prefill stalls decode",
        message=f"{len(dips) / len(steady):.0%} of {len(steady)} steady decode lines report less than half the median "
        f"gen throughput ({median:.0f} tok/s), and prefill takes about {share:.0%} of steady time.",
        evidence=evidence(dips, len(steady), median_throughput=round(median, 1), prefill_share=round(share, 3)),
        change=Change("prefill_budget", suggested), current=Current.of(chunk) if chunk else None,
        tradeoff="Smaller chunks prefill long prompts in more steps: higher TTFT for them.", ranks=dips.ranks,
        alternatives=(Change("mixed_chunk", True),), serves="latency")]
