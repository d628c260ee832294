"""The native CPU kernels as another x86-64 CPU builds them: `-march=native` on this machine takes the AVX-512 (and
AVX512-BF16) paths, so their portable paths only run when the sources are built for an older target. Each target
builds in a fresh process (one `toolkit_cpu` library per process) and is checked against torch."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib.resources import files

import pytest

from toolkit.runtime import kernels as cpu_kernels

PROBE = r"""
import json, sys
import torch
import torch.nn.functional as F
from torch.utils import cpp_extension

march, sources = sys.argv[1], sys.argv[2:]
cpp_extension.load(name="toolkit_cpu_kernels_" + march.replace("-", "_"), sources=sources,
                   extra_cflags=["-O3", f"-march={march}", "-fopenmp", "-ffp-contract=off"], is_python_module=False)
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
if ops.prefill_attention_supported():  # bf16 only, where oneDNN packs bf16 (AMX)
    qkv = torch.randn(150, 15 * 64).to(torch.bfloat16)
    q, k, v = qkv[:, :576].view(150, 9, 64), qkv[:, 576:768].view(150, 3, 64), qkv[:, 768:].view(150, 3, 64)
    attended = torch.empty_like(q)
    ops.prefill_attention(q, k, v, torch.tensor([0, 20]), torch.tensor([20, 130]), 0.125, attended)
    worst = 0.0
    for start, n in ((0, 20), (20, 130)):
        heads = [t[start : start + n].float().transpose(0, 1)[None] for t in (q, k, v)]
        reference = F.scaled_dot_product_attention(*heads, is_causal=True, scale=0.125, enable_gqa=True)
        worst = max(worst, (reference[0].transpose(0, 1) - attended[start : start + n].float()).abs().max().item())
    errors["prefill_attention bfloat16"] = worst
print(json.dumps(errors))
"""

# float32 to rounding; bf16 within a unit of its last place (norm/silu/rotary compare after rounding to bf16)
LIMITS = {"float32": 2e-5, "bfloat16": 0.04}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"),
                    reason="the targets are x86-64 ones, built with the machine's GCC")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2 (e.g. AMD EPYC Zen 2/3); the SSE2 baseline
def test_the_portable_paths_agree_with_torch(march, tmp_path):
    sources = [str(files("toolkit.runtime.kernels") / name) for name in cpu_kernels.SOURCES]
    done = subprocess.run([sys.executable, "-c", PROBE, march, *sources], capture_output=True, text=True,
                          timeout=400, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(errors) == 10 + cpu_kernels.prefill_attention_supported()
    for check, error in errors.items():
        assert error <= LIMITS[check.split()[-1]], (check, error)
