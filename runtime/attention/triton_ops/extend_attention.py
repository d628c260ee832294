"""Extend (prefill) attention for a ragged batch: each request's new tokens attend causally to its cached prefix
and to themselves, all read from the paged pool (the new K/V are stored before this runs).

One program per (request, query head, block of BLOCK_M new tokens) streams the request's KV slots in blocks of
BLOCK_N with an online softmax, stopping at the last token its queries can see.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from toolkit.runtime.attention.triton_ops.utils import block_size, exact_fp32_dot


@dataclass(frozen=True)
class ExtendConfig:
    block_m: int = 64
    block_n: int = 64
    num_stages: int = 2


@triton.jit
def _extend_attention_kernel(
    Q, O, K_Buffer, V_Buffer, QoIndptr, KvIndptr, KvIndices, sm_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kbuf_t, stride_kbuf_h, stride_vbuf_t, stride_vbuf_h,
    head_dim,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(QoIndptr + req)
    extend_len = tl.load(QoIndptr + req + 1) - q_start
    kv_start = tl.load(KvIndptr + req)
    seq_len = tl.load(KvIndptr + req + 1) - kv_start
    if block_m * BLOCK_M < extend_len:
        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < extend_len
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        q = tl.load(Q + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                    mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if FP32_DOT:
            q = q.to(tl.float32)
        # NOTE: query i of the request sits at position prefix_len + i and sees KV positions 0..prefix_len + i.
        q_pos = seq_len - extend_len + offs_m
        kv_end = tl.minimum(seq_len, seq_len - extend_len + (block_m + 1) * BLOCK_M)
        row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for block in range(0, kv_end, BLOCK_N):
            offs_n = block + tl.arange(0, BLOCK_N)
            mask_n = offs_n < kv_end
            slots = tl.load(KvIndices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(K_Buffer + slots[None, :] * stride_kbuf_t + kv_head * stride_kbuf_h + offs_d[:, None],
                        mask=mask_n[None, :] & mask_d[:, None], other=0.0).to(q.dtype)
            if FP32_DOT:
                qk = tl.dot(q, k, input_precision="ieee")
            else:
                qk = tl.dot(q, k)
            visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
            qk = tl.where(visible, qk * sm_scale, float("-inf"))
            v = tl.load(V_Buffer + slots[:, None] * stride_vbuf_t + kv_head * stride_vbuf_h + offs_d[None, :],
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(q.dtype)
            new_max = tl.maximum(tl.max(qk, 1), row_max)
            rescale = tl.exp(row_max - new_max)
            p = tl.exp(qk - new_max[:, None])
            if FP32_DOT:
                acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            row_sum = row_sum * rescale + tl.sum(p, 1)
            row_max = new_max
        out = (acc / row_sum[:, None]).to(O.dtype.element_ty)
        tl.store(O + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :], out,
                 mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    config: ExtendConfig = ExtendConfig(),
) -> None:
    """Causal attention of each request's new tokens q[qo_indptr[b]:qo_indptr[b+1]] over all of its tokens, whose
    slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]] (prefix first, the new tokens last).

    q/out: [tokens, heads, head_dim]; buffers: [slots, kv_heads, head_dim].
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    assert q.stride(-1) == 1 and out.stride(-1) == 1, "rows of q and out must be contiguous in head_dim"
    batch = qo_indptr.numel() - 1
    if batch == 0 or max_extend_len == 0:
        return
    block_d = block_size(head_dim)
    grid = (batch, num_heads, triton.cdiv(max_extend_len, config.block_m))
    _extend_attention_kernel[grid](
        q, out, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        head_dim,
        GROUP=num_heads // k_buffer.shape[1], BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=block_d,
        FP32_DOT=exact_fp32_dot(q.dtype), num_warps=4 if block_d <= 64 else 8,
        num_stages=1 if q.element_size() == 4 else config.num_stages,  # float32 tiles: keep shared memory small
    )
