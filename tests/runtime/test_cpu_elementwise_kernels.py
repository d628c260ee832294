"""The fused CPU elementwise kernels (residual add + RMSNorm, RMSNorm, neox rotary in place, SiLU * up) against the
chains of torch ops they replace, written here in Hugging Face's order: float32 to rounding, half precision within
one unit of its last place (the kernels round where torch rounds; the sum of squares is added in another order)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit.runtime import kernels
from toolkit.runtime.models.layers import RMSNorm, silu_and_mul
from toolkit.runtime.models.rotary import apply_rotary

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=8e-3),
             torch.float16: dict(atol=2e-3, rtol=1e-3)}
ROWS = [1, 3, 70]  # one row, a few, and more than one thread's share
FEATURES = 200  # not a multiple of 16: every vector loop has a tail


def _hf_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normalized = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normalized.to(x.dtype)


def _hf_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * torch.cat((cos, cos), -1)[:, None] + rotated * torch.cat((sin, sin), -1)[:, None]


def _rows(rows: int, features: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm_and_the_fused_residual_add(dtype, rows):
    x, residual = _rows(rows, FEATURES, dtype, 1), _rows(rows, FEATURES, dtype, 2)
    weight = _rows(1, FEATURES, dtype, 3)[0]
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-6), _hf_norm(x, weight, 1e-6), **TOLERANCE[dtype])

    summed = residual + x
    x_inout, residual_inout = x.clone(), residual.clone()
    kernels.fused_add_rms_norm(x_inout, residual_inout, weight, 1e-6)
    assert torch.equal(residual_inout, summed)  # one addition, rounded once: the same bits as torch
    torch.testing.assert_close(x_inout, _hf_norm(summed, weight, 1e-6), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul(dtype, rows):
    gate_up = _rows(rows, 2 * FEATURES, dtype, 4)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_and_mul(gate_up), F.silu(gate) * up, **TOLERANCE[dtype])


def test_silu_saturates_without_overflow():
    gate_up = torch.tensor([[-200.0, -88.0, 0.0, 88.0, 200.0] + [1.0] * 11 + [1.0] * 16])
    out = kernels.silu_and_mul(gate_up)
    torch.testing.assert_close(out, F.silu(gate_up[:, :16]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", ROWS)
def test_rotary_rotates_strided_q_and_k_in_place(dtype, tokens):
    """q and k are views of one qkv projection (rows strided by the whole projection), as in the decoder."""
    heads, kv_heads, dim = 9, 3, 64
    qkv = _rows(tokens, (heads + 2 * kv_heads) * dim, dtype, 5)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)
    angles = torch.rand(tokens, dim // 2, generator=torch.Generator().manual_seed(6)) * 100
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected_q, expected_k, untouched_v = _hf_rotate(q, cos, sin), _hf_rotate(k, cos, sin), v.clone()
    kernels.rotary_neox(q, k, cos, sin)
    torch.testing.assert_close(q, expected_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k, expected_k, **TOLERANCE[dtype])
    assert torch.equal(v, untouched_v)


def test_the_decoder_layers_take_the_fused_path_on_cpu():
    """RMSNorm's residual form writes in place (the fused kernel ran); apply_rotary returns the very tensors."""
    norm = RMSNorm(FEATURES, 1e-6)
    x, residual = _rows(4, FEATURES, torch.float32, 7), _rows(4, FEATURES, torch.float32, 8)
    normalized, summed = norm.forward_with_residual(x, residual)
    assert normalized is x and summed is residual
    q, k = torch.randn(2, 9, 64), torch.randn(2, 3, 64)
    cos, sin = torch.randn(2, 1, 32), torch.randn(2, 1, 32)
    assert all(a is b for a, b in zip(apply_rotary(q, k, (cos, sin)), (q, k)))
    gate_up = _rows(4, 2 * FEATURES, torch.float32, 9)
    torch.testing.assert_close(silu_and_mul(gate_up), kernels.silu_and_mul(gate_up), atol=0, rtol=0)


def test_the_kernels_refuse_mismatched_shapes_with_a_clear_error():
    with pytest.raises(RuntimeError, match="gate_up must be"):
        torch.ops.toolkit_cpu.silu_and_mul(torch.randn(2, 6), torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="residual like x"):
        kernels.fused_add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="cos and sin must be"):
        kernels.rotary_neox(torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 8), torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        kernels.rms_norm(torch.ones(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 1e-6)


def test_without_the_kernels_the_layers_compute_the_same_with_torch_ops(monkeypatch):
    norm = RMSNorm(FEATURES, 1e-6)
    norm.weight.data = _rows(1, FEATURES, torch.float32, 10)[0]
    x, residual = _rows(4, FEATURES, torch.float32, 11), _rows(4, FEATURES, torch.float32, 12)
    gate_up = _rows(4, 2 * FEATURES, torch.float32, 13)
    q, k = _rows(2, 9 * 64, torch.float32, 14).view(2, 9, 64), _rows(2, 3 * 64, torch.float32, 15).view(2, 3, 64)
    angles = torch.rand(2, 1, 32) * 10
    fused = (norm.forward_with_residual(x.clone(), residual.clone()), silu_and_mul(gate_up),
             apply_rotary(q.clone(), k.clone(), (angles.cos(), angles.sin())))
    monkeypatch.setattr(kernels, "available", lambda: False)
    normalized, summed = norm.forward_with_residual(x, residual)
    assert summed is not residual  # the torch ops ran
    torch.testing.assert_close((normalized, summed), fused[0], **TOLERANCE[torch.float32])
    torch.testing.assert_close(silu_and_mul(gate_up), fused[1], **TOLERANCE[torch.float32])
    torch.testing.assert_close(apply_rotary(q, k, (angles.cos(), angles.sin())), fused[2], **TOLERANCE[torch.float32])


def test_bf16_rounding_of_the_vector_loops_is_torchs_at_the_edges():
    """Ties to even both ways, overflow to inf, NaN, subnormals: the residual sum rounds like torch's bf16 add in
    the sixteen-wide loops and in the scalar tail (48 + 5 values)."""
    tiny = 2.0 ** -130  # a bf16 subnormal
    pairs = [(1.0, 2.0 ** -8), (1.0078125, 2.0 ** -8), (-1.0, -(2.0 ** -8)), (3e38, 3e38), (-3e38, -3e38),
             (float("nan"), 1.0), (float("inf"), float("-inf")), (tiny, tiny), (tiny, -tiny), (65504.0, 0.5),
             (0.1, 0.2)]
    pairs = (pairs * 5)[:53]
    residual = torch.tensor([[a for a, _ in pairs]]).to(torch.bfloat16)
    x = torch.tensor([[b for _, b in pairs]]).to(torch.bfloat16)
    expected = residual + x
    kernels.fused_add_rms_norm(x.clone(), residual, torch.ones(53, dtype=torch.bfloat16), 1e-6)
    finite = ~expected.isnan()
    assert torch.equal(residual[finite].view(torch.int16), expected[finite].view(torch.int16))
    assert torch.equal(residual.isnan(), expected.isnan())
