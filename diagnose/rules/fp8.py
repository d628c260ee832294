"""`fp8.kv_cache` / `fp8.weights`: the server is memory-bound and could store KV (or weights) in fp8.

Memory-bound: >= 50% of steady load lines have a queue and KV usage >= 0.9, or retractions (preemptions) are
frequent. Then suggest an fp8 KV cache (SGLang `fp8_e5m2`, vLLM `fp8`; twice the tokens per GB) when the KV
cache is not fp8 yet, and `--quantization fp8` when 16-bit weights take >= 40% of the GPU. Not judged on CPU.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.rules.retraction import FREQUENT_PER_MIN
from toolkit.diagnose.vocabulary import Change

FULL_USAGE = 0.9
BOUND_FRACTION = 0.5
HEAVY_WEIGHTS = 0.4


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg.device == "cpu":
        return []
    steady = ctx.steady_enough()
    if steady is None:
        return []
    full = steady.where((steady["queue_req"] > 0) & (steady["usage"] >= FULL_USAGE))
    _, rate, _ = ctx.retraction_rate()
    frac = len(full) / len(steady)
    if frac < BOUND_FRACTION and not (rate is not None and rate > FREQUENT_PER_MIN):
        return []
    out = []
    if frac >= BOUND_FRACTION:
        why = (f"the KV pool was >= {FULL_USAGE:.0%} full with requests waiting in {frac:.0%} of "
               f"{len(steady)} steady {ctx.load_word} lines")
    else:
        why = f"decode retracted requests {rate:.1f} times per busy minute"
    if "fp8" not in cfg.kv_cache_dtype:
        out.append(Finding(
            id="fp8.kv_cache", severity="info", title="Memory-bound: store the KV cache in fp8",
            message=f"The server is memory-bound: {why}. An fp8 KV cache holds twice the tokens in the same memory.",
            evidence=evidence(full, len(steady), full_fraction=round(frac, 3)), change=Change("kv_dtype", cfg.fp8_kv),
            current=Current.of(cfg.kv_cache_dtype), tradeoff="Slight accuracy loss; check your evals.",
            ranks=full.ranks))
    weights, gpu = cfg.weight_mem_gb, cfg.gpu_mem_gb
    sixteen_bit = cfg.dtype is None or "16" in cfg.dtype or cfg.dtype == "auto"
    if weights and gpu and weights / gpu >= HEAVY_WEIGHTS and not cfg.quantization and sixteen_bit:
        out.append(Finding(
            id="fp8.weights", severity="info", title="Memory-bound with heavy weights: fp8 weights",
            message=f"{why}; the weights take {weights:.1f} of {gpu:.0f} GB per GPU. fp8 weights free about half of "
            "that for KV cache.", evidence=evidence(full, len(steady), weight_gb=weights, gpu_mem_gb=gpu),
            change=Change("quantization", "fp8"), current=Current(value=None, said="none"),
            tradeoff="Slight accuracy loss; needs a GPU with fp8 support (Hopper+).", ranks=full.ranks))
    return out
