"""Write the new tokens' K and V into their pool slots: one program per token, all KV heads at once."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.runtime.attention.triton_ops.utils import block_size
from toolkit.runtime.memory.kv_pool import quantize_kv


@triton.jit
def _store_kv_kernel(
    K, V, K_Buffer, V_Buffer, Loc,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kbuf_t, stride_kbuf_h, stride_vbuf_t, stride_vbuf_h,
    num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(Loc + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)
    k = tl.load(K + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(V + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    k_dst = K_Buffer + slot * stride_kbuf_t + offs_h[:, None] * stride_kbuf_h + offs_d[None, :]
    v_dst = V_Buffer + slot * stride_vbuf_t + offs_h[:, None] * stride_vbuf_h + offs_d[None, :]
    tl.store(k_dst, k, mask=mask)
    tl.store(v_dst, v, mask=mask)


def store_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """k_buffer[loc[t]] = k[t] (and V alike) in the pool's dtype (an fp8 pool: k / k_scale, clamped). k/v:
    [tokens, kv_heads, head_dim] with a contiguous last dim; the buffers: [slots, kv_heads, head_dim]."""
    tokens, num_kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    # NOTE: torch casts (round to nearest, as torch_native's pool does); the kernel itself only copies.
    k, v = quantize_kv(k, k_buffer.dtype, k_scale), quantize_kv(v, v_buffer.dtype, v_scale)
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "K/V rows must be contiguous in head_dim"
    _store_kv_kernel[(tokens,)](
        k, v, k_buffer, v_buffer, loc,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        num_kv_heads, head_dim,
        BLOCK_H=block_size(num_kv_heads, 1), BLOCK_D=block_size(head_dim),
    )
