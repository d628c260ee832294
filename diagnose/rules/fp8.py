"""`fp8.kv_cache` / `fp8.weights`: the server is memory-bound and could store KV (or weights) in fp8.

Memory-bound: >= 50% of steady decode lines have a queue and token usage >= 0.9, or retractions are frequent.
Then suggest `--kv-cache-dtype fp8_e5m2` (twice the tokens per GB) when the KV cache is not fp8 yet, and
`--quantization fp8` when 16-bit weights take >= 40% of the GPU.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, ranks_of
from toolkit.diagnose.rules.retraction import FREQUENT_PER_MIN

FULL_USAGE = 0.9
BOUND_FRACTION = 0.5
HEAVY_WEIGHTS = 0.4


def check(ctx: Context) -> list[Finding]:
    steady, cfg = ctx.steady(), ctx.config
    if len(steady) < MIN_LINES or cfg.device == "cpu":
        return []
    full = steady[(steady["queue_req"] > 0) & (steady["usage"] >= FULL_USAGE)]
    _, rate, _ = ctx.retraction_rate()
    frac = len(full) / len(steady)
    if frac < BOUND_FRACTION and not (rate is not None and rate > FREQUENT_PER_MIN):
        return []
    out = []
    if frac >= BOUND_FRACTION:
        why = (f"the KV pool was >= {FULL_USAGE:.0%} full with requests waiting in {frac:.0%} of "
               f"{len(steady)} steady decode lines")
    else:
        why = f"decode retracted requests {rate:.1f} times per busy minute"
    if "fp8" not in cfg.kv_cache_dtype:
        out.append(Finding(
            "fp8.kv_cache", "info", "Memory-bound: store the KV cache in fp8",
            f"The server is memory-bound: {why}. An fp8 KV cache holds twice the tokens in the same memory.",
            evidence(full, len(steady), full_fraction=round(frac, 3)), "--kv-cache-dtype", "fp8_e5m2",
            cfg.kv_cache_dtype, "Slight accuracy loss; check your evals.", ranks_of(full)))
    weights, gpu = cfg.weight_mem_gb, cfg.gpu_mem_gb
    sixteen_bit = cfg.dtype is None or "16" in cfg.dtype
    if weights and gpu and weights / gpu >= HEAVY_WEIGHTS and not cfg.quantization and sixteen_bit:
        out.append(Finding(
            "fp8.weights", "info", "Memory-bound with heavy weights: fp8 weights",
            f"{why}; the weights take {weights:.1f} of {gpu:.0f} GB per GPU. fp8 weights free about half of "
            "that for KV cache.", evidence(full, len(steady), weight_gb=weights, gpu_mem_gb=gpu),
            "--quantization", "fp8", "none", "Slight accuracy loss; needs a GPU with fp8 support (Hopper+).",
            ranks_of(full)))
    return out
