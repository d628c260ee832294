"""`parallelism.dp_over_tp`: tensor parallelism for a model that fits on one GPU.

Trigger: `--tp-size` >= 2, `--dp-size` 1, and the whole model's weights (per-rank weight memory x TP) take
<= 50% of one GPU: replicas (data parallelism) avoid all-reduce per layer and usually give more throughput.
Judged from the weights the log prints only: a model's name is no measurement (the parameter counts once read
from names, against a GPU the log did not size, stood for no signal of the log's own; issue 49).
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Evidence, Finding
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import Change

FITS_FRACTION = 0.5


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    tp, weights, gpu = cfg.tp_size, cfg.total_weight_gb, cfg.gpu_mem_gb
    if tp < 2 or cfg.dp_size > 1 or weights is None or not gpu or weights > FITS_FRACTION * gpu:
        return []
    rows = ctx.timeline.kind("weights_loaded" if cfg.vllm else "load_end")
    dp, tp_flag = cfg.flag("dp"), cfg.flag("tp")
    return [Finding(
        id="parallelism.dp_over_tp", severity="info", title="Model fits on one GPU: prefer data parallelism",
        message=f"The weights take {weights:.1f} GB in all ({weights / gpu:.0%} of one {gpu:.0f} GB GPU) but run with "
        f"tp_size={tp}. {tp} replicas ({dp} {tp} {tp_flag} 1) skip the per-layer all-reduce.",
        evidence=Evidence(count=len(rows), total=None, span=None, lines=tuple(e.line for e in rows[:5]),
                 facts={"total_weight_gb": weights, "gpu_mem_gb": gpu, "tp_size": tp}),
        change=Change("dp", str(tp), companions=(Change("tp", "1"),)), current=Current.of(1, f"tp_size={tp}"),
        tradeoff="Each replica has a smaller KV pool and a single request decodes slower than with TP.")]

