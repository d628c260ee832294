"""`parallelism.dp_over_tp`: tensor parallelism for a model that fits on one GPU.

Trigger: `--tp-size` >= 2, `--dp-size` 1, and the whole model's weights (per-rank weight memory x TP) take
<= 50% of one GPU: replicas (data parallelism) avoid all-reduce per layer and usually give more throughput.
Where the log gives no weights (a pasted launch command and a few stats lines, arena-hard-auto#81), the model's
name may: a model of at most `SMALL_PARAMS_B` billion parameters (`qwen2.5-1.5B`: at most 2 bytes each, half of
a 16 GB GPU at most) fits one GPU of 16 GB or more, and one the log sizes where they take at most half of it;
judged at low confidence.
"""
from __future__ import annotations

import re

from toolkit.diagnose.findings import Evidence, Finding
from toolkit.diagnose.flags import flag
from toolkit.diagnose.ideas import Change
from toolkit.diagnose.rules.context import Context

FITS_FRACTION = 0.5
SMALL_PARAMS_B = 4.0
# a parameter count in a model's name (`Qwen2.5-1.5B`, `Qwen3-30B-A3B`: the first, the whole model's), not an
# expert's (`8x7B`) or a version's
_PARAMS = re.compile(r"(?<![\w.])(\d{1,4}(?:\.\d{1,2})?)[Bb](?![a-zA-Z0-9])")


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    tp, weights, gpu = cfg.tp_size, cfg.total_weight_gb, cfg.gpu_mem_gb
    if tp < 2 or cfg.dp_size > 1:
        return []
    if weights is None:
        return _small_by_name(ctx)
    if not gpu or weights > FITS_FRACTION * gpu:
        return []
    rows = ctx.timeline.kind("weights_loaded" if cfg.vllm else "load_end")
    dp, tp_flag = flag(cfg, "dp"), flag(cfg, "tp")
    return [Finding(
        "parallelism.dp_over_tp", "info", "Model fits on one GPU: prefer data parallelism",
        f"The weights take {weights:.1f} GB in all ({weights / gpu:.0%} of one {gpu:.0f} GB GPU) but run with "
        f"tp_size={tp}. {tp} replicas ({dp} {tp} {tp_flag} 1) skip the per-layer all-reduce.",
        Evidence(len(rows), None, None, tuple(e.line for e in rows[:5]),
                 {"total_weight_gb": weights, "gpu_mem_gb": gpu, "tp_size": tp}),
        Change("dp", str(tp), companions=(Change("tp", "1"),)), f"1 (tp_size={tp})",
        "Each replica has a smaller KV pool and a single request decodes slower than with TP.")]


def _small_by_name(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    name = (cfg.model or "").rstrip("/")
    m = _PARAMS.search(name.rsplit("/", 1)[-1])
    if m is None or float(m.group(1)) > SMALL_PARAMS_B or not len(ctx.timeline.load()):
        return []
    params, tp = float(m.group(1)), cfg.tp_size
    if cfg.gpu_mem_gb and 2 * params > FITS_FRACTION * cfg.gpu_mem_gb:
        return []
    dp, tp_flag = flag(cfg, "dp"), flag(cfg, "tp")
    load = ctx.timeline.load()
    return [Finding(
        "parallelism.dp_over_tp", "info", "Model fits on one GPU: prefer data parallelism",
        f"The model's name says {params:g}B parameters (at most {2 * params:g} GB in 16-bit weights: one GPU holds "
        f"it) but it runs with tp_size={tp}. {tp} replicas ({dp} {tp} {tp_flag} 1) skip the per-layer all-reduce.",
        Evidence(len(load), None, None, tuple(int(x) for x in load.head(5)["line"].tolist()),
                 {"params_b": params, "tp_size": tp, "model": name}),
        Change("dp", str(tp), companions=(Change("tp", "1"),)), f"1 (tp_size={tp})",
        "Each replica has a smaller KV pool and a single request decodes slower than with TP.", confidence="low")]
