"""The native CPU kernels as every kernel tier builds them (`cpu_capability.KERNEL_TIERS`): each tier this CPU can
run is built by the runtime's own `load_kernels()` in a fresh process (one `toolkit_cpu` library per process) with
`TOOLKIT_CPU_KERNEL_TIER` forcing it, and checked against torch; so an AVX-512 machine also runs the AVX2 and SSE
paths, and the tiers it cannot run are skipped naming what it lacks. Each test prints its tier's max errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.runtime import cpu_capability
from toolkit.runtime import kernels as cpu_kernels

PROBE = r"""
import json, sys
import torch
import torch.nn.functional as F
from toolkit.runtime import cpu_capability, kernels

kernels.load_kernels()
ops = torch.ops.toolkit_cpu
torch.manual_seed(0)
errors = {}
for dtype in (torch.float32, torch.bfloat16):
    name = str(dtype).split(".")[-1]
    x, residual, weight = torch.randn(70, 200).to(dtype), torch.randn(70, 200).to(dtype), torch.randn(200).to(dtype)
    def hf_norm(t):
        return weight * (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    out = torch.empty_like(x)
    ops.rms_norm(x, weight, 1e-6, out)
    errors[f"rms_norm {name}"] = (out.float() - hf_norm(x).float()).abs().max().item()
    summed, x_inout, residual_inout = residual + x, x.clone(), residual.clone()
    ops.fused_add_rms_norm(x_inout, residual_inout, weight, 1e-6)
    errors[f"fused_add_rms_norm {name}"] = max((residual_inout.float() - summed.float()).abs().max().item(),
                                               (x_inout.float() - hf_norm(summed).float()).abs().max().item())
    gate_up, act = torch.randn(70, 400).to(dtype), torch.empty(70, 200, dtype=dtype)
    ops.silu_and_mul(gate_up, act)
    gate, up = gate_up.chunk(2, dim=-1)
    errors[f"silu_and_mul {name}"] = (act.float() - (F.silu(gate) * up).float()).abs().max().item()
    q, k = torch.randn(6, 9, 64).to(dtype), torch.randn(6, 3, 64).to(dtype)
    angles = torch.rand(6, 32) * 50
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    def rotate(t):
        a, b = t.float().chunk(2, dim=-1)
        c, s = cos.float()[:, None], sin.float()[:, None]
        return torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    expected = rotate(q), rotate(k)
    ops.rotary_neox(q, k, cos, sin)
    errors[f"rotary_neox {name}"] = max((q.float() - expected[0]).abs().max().item(),
                                        (k.float() - expected[1]).abs().max().item())
    lengths, q = torch.tensor([1, 17, 100, 64, 300]), q[:5]
    k_pool, v_pool = torch.randn(600, 3, 64).to(dtype), torch.randn(600, 3, 64).to(dtype)
    table, slots = torch.zeros(5, 400, dtype=torch.int32), torch.randperm(599) + 1
    for b, n in enumerate(lengths.tolist()):
        table[b, :n] = slots[:n].int()
    attended = torch.empty_like(q)
    ops.paged_decode_attention(q, k_pool, v_pool, table, torch.arange(5), lengths, 0.125, attended)
    worst = 0.0
    for b, n in enumerate(lengths.tolist()):
        keys = k_pool[table[b, :n].long()].float().repeat_interleave(3, 1).transpose(0, 1)
        values = v_pool[table[b, :n].long()].float().repeat_interleave(3, 1).transpose(0, 1)
        reference = torch.softmax(q[b].float()[:, None] @ keys.transpose(1, 2) * 0.125, dim=-1) @ values
        worst = max(worst, (reference[:, 0] - attended[b].float()).abs().max().item())
    errors[f"paged_decode_attention {name}"] = worst
for dtype in (torch.float32, torch.bfloat16):
    if not ops.prefill_attention_supported(dtype):  # bf16 where oneDNN packs bf16 (AMX), float32 with AVX2
        continue
    qkv = torch.randn(150, 15 * 64).to(dtype)
    q, k, v = qkv[:, :576].view(150, 9, 64), qkv[:, 576:768].view(150, 3, 64), qkv[:, 768:].view(150, 3, 64)
    attended = torch.empty_like(q)
    ops.prefill_attention(q, k, v, torch.tensor([0, 20]), torch.tensor([20, 130]), 0.125, attended)
    worst = 0.0
    for start, n in ((0, 20), (20, 130)):
        heads = [t[start : start + n].float().transpose(0, 1)[None] for t in (q, k, v)]
        reference = F.scaled_dot_product_attention(*heads, is_causal=True, scale=0.125, enable_gqa=True)
        worst = max(worst, (reference[0].transpose(0, 1) - attended[start : start + n].float()).abs().max().item())
    errors[f"prefill_attention {str(dtype).split('.')[-1]}"] = worst
library = next(line.split()[-1] for line in open("/proc/self/maps") if kernels.extension_name(cpu_capability.probe().tier) in line)
print(json.dumps({"tier": cpu_capability.probe().tier.name, "errors": errors, "library": library}))
"""

# float32 to rounding; bf16 within a unit of its last place (norm/silu/rotary compare after rounding to bf16)
LIMITS = {"float32": 2e-5, "bfloat16": 0.04}


CPU = cpu_capability.probe()
TIERS = [t.name for t in cpu_capability.KERNEL_TIERS]


def _runnable(tier: str) -> bool:
    chosen = cpu_capability.tier_named(tier)
    return chosen.arch == CPU.arch and chosen.requires <= CPU.features


@pytest.fixture(scope="module")
def builds() -> dict[str, subprocess.Popen]:
    """Every tier this CPU can run, built at once, one process each (a build is one compiler process: side by side
    they take the time of the slowest, not the sum); each test waits for its own. Every tier builds where the
    runtime builds it (the user's cache, in a folder named after the tier), so the server tests and the AVX2-path
    tests load these builds instead of making their own: each tier is built once a run."""
    started = {tier: subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env={**os.environ, cpu_capability.TIER_ENV: tier})
               for tier in filter(_runnable, TIERS)}
    yield started
    for process in started.values():
        process.kill()
        process.communicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tiers are built with the machine's GCC")
@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_builds_and_agrees_with_torch(tier, builds):
    chosen = cpu_capability.tier_named(tier)
    if not _runnable(tier):
        pytest.skip(f"this CPU ({CPU.arch}) cannot run {tier}: lacks "
                    f"{' '.join(sorted(chosen.requires - CPU.features)) or 'its architecture'}")
    process = builds[tier]
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    print(f"{tier}: " + ", ".join(f"{check} {error:.2e}" for check, error in result["errors"].items()))
    assert result["tier"] == tier
    # the tier names the build folder, so a cache made on another CPU is never loaded here
    library = Path(result["library"])
    assert library.parent.name == cpu_kernels.extension_name(chosen), library
    # float32 prefill attention on every x86 tier with AVX2 (x86-64-v3 and up); bf16 where oneDNN packs it
    with_avx2 = chosen.arch == "x86_64" and tier != "x86-64-v2"
    assert ("prefill_attention float32" in result["errors"]) == with_avx2, result["errors"]
    assert len(result["errors"]) == 10 + with_avx2 + ("prefill_attention bfloat16" in result["errors"])
    for check, error in result["errors"].items():
        assert error <= LIMITS[check.split()[-1]], (check, error)
