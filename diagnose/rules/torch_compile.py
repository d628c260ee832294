"""`torch_compile.small_model`: small model at small batch without `--enable-torch-compile`.

Trigger: weights <= 16 GB in all (about 8B parameters in bf16), median steady batch <= 16 requests, and
torch.compile off (vLLM compiles by default). Suggest `--torch-compile-max-bs` = the p90 batch as a power of two (<= 32).
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, evidence
from toolkit.diagnose.rules.context import MIN_LINES, Context, pow2_at_least
from toolkit.diagnose.vocabulary import Change

SMALL_MODEL_GB = 16.0
SMALL_BATCH = 16
MAX_BS = 32


def check(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    steady = ctx.steady()
    weights = cfg.total_weight_gb
    if cfg.torch_compile or cfg.device == "cpu" or weights is None or len(steady) < MIN_LINES:
        return []
    median = steady.median("running_req")
    if weights > SMALL_MODEL_GB or median > SMALL_BATCH:
        return []
    bs = pow2_at_least(steady.quantile("running_req", 0.9), MAX_BS)
    return [Finding(
        id="torch_compile.small_model", severity="info", title="Small model at small batch: try torch.compile",
        message=f"The model's weights take {weights:.1f} GB and the median steady batch is {median:.0f} requests; "
        "torch.compile fuses the small kernels that dominate at this size.",
        evidence=evidence(steady, len(steady), total_weight_gb=weights, median_running=median),
        change=Change("torch_compile", True, companions=(Change("torch_compile_max_bs", str(bs)),)),
        current=Current(value=False, said="off"),
        tradeoff="Compilation adds minutes to start-up; check output quality once.", ranks=steady.ranks)]
