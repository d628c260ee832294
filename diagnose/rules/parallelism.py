"""`parallelism.dp_over_tp`: tensor parallelism for a model that fits on one GPU.

Trigger: `--tp-size` >= 2, `--dp-size` 1, and the whole model's weights (per-rank weight memory x TP) take
<= 50% of one GPU: replicas (data parallelism) avoid all-reduce per layer and usually give more throughput.
Where the log gives no weights (a pasted launch command and a few stats lines, arena-hard-auto#81), the model's
name may: a model of at most `SMALL_PARAMS_B` billion parameters (`qwen2.5-1.5B`: at most 2 bytes each, half of
a 16 GB GPU at most) fits one GPU of 16 GB or more, and one the log sizes where they take at most half of it;
judged at low confidence.

`parallelism.tp_too_small`: the other way round: at TP 1, a model whose name says more parameters than one GPU
holds in 16-bit weights (2 bytes each above the log's GPU memory, else above `LARGEST_GPU_GB`; not a quantized
checkpoint's name) and a start-up that failed before its weights were loaded (downstream qwen3-vl#239: a 72B model
at TP 1, 144 GB): the power of two of GPUs whose `USABLE_GB` each hold the weights.
"""
from __future__ import annotations

import math

from toolkit.diagnose.findings import Current, Evidence, Finding, evidence_events
from toolkit.diagnose.read.arguments import model_name
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import Change

FITS_FRACTION = 0.5
SMALL_PARAMS_B = 4.0
LARGEST_GPU_GB = 141.0  # H200's; a GPU the log does not size holds at most this
USABLE_GB = 64.0  # of an 80 GB GPU, for weights beside the KV cache and activations
# start-up lines printed once the weights are loaded (vLLM's, then SGLang's)
_LOADED = ("weights_loaded", "memory_profile", "kv_memory", "kv_capacity", "gpu_blocks", "graph_captured",
           "load_end", "kv_alloc", "pool", "pool_end", "graph_begin", "graph_progress", "graph_end")


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    tp, weights, gpu = cfg.tp_size, cfg.total_weight_gb, cfg.gpu_mem_gb
    if tp == 1:
        return _too_large_by_name(ctx)
    if tp < 2 or cfg.dp_size > 1:
        return []
    if weights is None:
        return _small_by_name(ctx)
    if not gpu or weights > FITS_FRACTION * gpu:
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


def _too_large_by_name(ctx: Context) -> list[Finding]:
    cfg, tl = ctx.config, ctx.timeline
    name = cfg.model or ""
    said = model_name(name)
    params = said.params_b
    gpu = cfg.gpu_mem_gb or LARGEST_GPU_GB
    if params is None or 2 * params <= gpu or said.quantized:
        return []
    if any(tl.kind(kind) for kind in _LOADED) or len(tl.load()):
        return []  # NOTE: the weights loaded (a line printed after loading them): they fitted
    crash = (tl.kind("exception") + tl.kind("oom"))[:1]
    if not crash:
        return []
    gpus = 1 << max(1, math.ceil(math.log2(2 * params / USABLE_GB)))
    tp_flag = cfg.flag("tp")
    return [Finding(
        id="parallelism.tp_too_small", severity="warning", title="The model is larger than one GPU holds",
        message=f"The model's name says {params:g}B parameters: {2 * params:g} GB in 16-bit weights, more than "
        + (f"one GPU holds ({cfg.gpu_mem_gb:g} GB here)" if cfg.gpu_mem_gb else
           f"any one GPU holds ({LARGEST_GPU_GB:g} GB at most)")
        + f"; it ran with tp_size=1 and start-up failed before the weights were loaded. {tp_flag} {gpus} spreads "
        f"them over {gpus} GPUs ({2 * params / gpus:.0f} GB each).",
        evidence=evidence_events(crash, params_b=params, tp_size=1, model=name), change=Change("tp", str(gpus)),
        current=Current.of(1),
        tradeoff="More GPUs for one server; a quantized checkpoint (FP8, AWQ) instead halves or quarters the weights.",
        confidence="medium")]


def _small_by_name(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    name = (cfg.model or "").rstrip("/")
    params_b = model_name(name).params_b
    if params_b is None or params_b > SMALL_PARAMS_B or not len(ctx.timeline.load()):
        return []
    params, tp = params_b, cfg.tp_size
    if cfg.gpu_mem_gb and 2 * params > FITS_FRACTION * cfg.gpu_mem_gb:
        return []
    dp, tp_flag = cfg.flag("dp"), cfg.flag("tp")
    load = ctx.timeline.load()
    return [Finding(
        id="parallelism.dp_over_tp", severity="info", title="Model fits on one GPU: prefer data parallelism",
        message=f"The model's name says {params:g}B parameters (at most {2 * params:g} GB in 16-bit weights: one GPU "
        f"holds it) but it runs with tp_size={tp}. {tp} replicas ({dp} {tp} {tp_flag} 1) skip the per-layer "
        "all-reduce.",
        evidence=Evidence(count=len(load), lines=tuple(int(x) for x in load.head(5)["line"].tolist()),
                          facts={"params_b": params, "tp_size": tp, "model": name}),
        change=Change("dp", str(tp), companions=(Change("tp", "1"),)), current=Current.of(1, f"tp_size={tp}"),
        tradeoff="Each replica has a smaller KV pool and a single request decodes slower than with TP.",
        confidence="low")]
