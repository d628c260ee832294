"""Paged decode attention with split-KV (flash-decoding), grouped over the query heads that share a KV head.

Stage 1: one program per (request, group of query heads, KV split) computes a softmax-normalized partial output
and its log-sum-exp over its slice of the request's tokens. Stage 2: one program per (request, head) merges the
splits. Splitting lets a few long requests still spread over the whole GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from toolkit.runtime.attention.triton_ops.utils import block_size, exact_fp32_dot

_BLOCK_H = 16  # tl.dot needs at least 16 rows; groups smaller than this are masked


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64  # KV tokens per inner step; every split but the last is a multiple of it
    num_warps: int = 4
    num_stages: int = 2


@triton.jit
def _split_bounds(seq_len, num_splits, split, BLOCK_N: tl.constexpr):
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = per_split * split
    return start, tl.minimum(start + per_split, seq_len)


@triton.jit
def _decode_stage1_kernel(
    Q, K_Buffer, V_Buffer, KvIndptr, KvIndices, NumKvSplits, PartialOut, PartialLse, sm_scale,
    stride_qb, stride_qh, stride_kbuf_t, stride_kbuf_h, stride_vbuf_t, stride_vbuf_h,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    head_dim,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    req = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    VALID_H: tl.constexpr = BLOCK_H if GROUP > BLOCK_H else GROUP
    BLOCKS_PER_KV_HEAD: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = head_block // BLOCKS_PER_KV_HEAD
    heads = kv_head * GROUP + (head_block % BLOCKS_PER_KV_HEAD) * VALID_H + tl.arange(0, BLOCK_H)
    mask_h = (tl.arange(0, BLOCK_H) < VALID_H) & (heads < (kv_head + 1) * GROUP)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim

    kv_start = tl.load(KvIndptr + req)
    seq_len = tl.load(KvIndptr + req + 1) - kv_start
    num_splits = tl.load(NumKvSplits + req)
    start, end = _split_bounds(seq_len, num_splits, split, BLOCK_N)
    if (split < num_splits) & (start < end):
        q = tl.load(Q + req * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_h[:, None] & mask_d[None, :], other=0.0)
        if FP32_DOT:
            q = q.to(tl.float32)
        row_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for block in range(start, end, BLOCK_N):
            offs_n = block + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            slots = tl.load(KvIndices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(K_Buffer + slots[None, :] * stride_kbuf_t + kv_head * stride_kbuf_h + offs_d[:, None],
                        mask=mask_n[None, :] & mask_d[:, None], other=0.0).to(q.dtype)
            if FP32_DOT:
                qk = tl.dot(q, k, input_precision="ieee")
            else:
                qk = tl.dot(q, k)
            qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))
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
        out = PartialOut + req * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
        tl.store(out, acc / row_sum[:, None], mask=mask_h[:, None] & mask_d[None, :])
        tl.store(PartialLse + req * stride_lb + heads * stride_lh + split, row_max + tl.log(row_sum), mask=mask_h)


@triton.jit
def _decode_stage2_kernel(
    PartialOut, PartialLse, O, KvIndptr, NumKvSplits,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    head_dim, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    seq_len = tl.load(KvIndptr + req + 1) - tl.load(KvIndptr + req)
    num_splits = tl.load(NumKvSplits + req)
    total_max = float("-inf")
    total_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(0, num_splits):
        start, end = _split_bounds(seq_len, num_splits, split, BLOCK_N)
        if start < end:
            part = tl.load(PartialOut + req * stride_pb + head * stride_ph + split * stride_ps + offs_d,
                           mask=mask_d, other=0.0)
            lse = tl.load(PartialLse + req * stride_lb + head * stride_lh + split)
            new_max = tl.maximum(lse, total_max)
            rescale = tl.exp(total_max - new_max)
            weight = tl.exp(lse - new_max)
            acc = acc * rescale + weight * part
            total_sum = total_sum * rescale + weight
            total_max = new_max
    tl.store(O + req * stride_ob + head * stride_oh + offs_d, (acc / total_sum).to(O.dtype.element_ty), mask=mask_d)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    num_kv_splits: torch.Tensor,
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    sm_scale: float,
    config: DecodeConfig = DecodeConfig(),
) -> None:
    """out[b] = softmax(q[b] K_b^T * sm_scale) V_b over request b's slots kv_indices[kv_indptr[b]:kv_indptr[b+1]].

    q/out: [batch, heads, head_dim]; buffers: [slots, kv_heads, head_dim]; num_kv_splits[b] >= 1 splits per
    request, at most partial_out.shape[2]; partial_out [batch, heads, max_splits, head_dim] and partial_lse
    [batch, heads, max_splits] are float32 scratch.
    """
    batch, num_heads, head_dim = q.shape
    assert q.stride(-1) == 1 and out.stride(-1) == 1, "rows of q and out must be contiguous in head_dim"
    num_kv_heads = k_buffer.shape[1]
    group = num_heads // num_kv_heads
    max_splits = partial_out.shape[2]
    block_d = block_size(head_dim)
    grid = (batch, num_kv_heads * triton.cdiv(group, _BLOCK_H), max_splits)
    _decode_stage1_kernel[grid](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, num_kv_splits, partial_out, partial_lse, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), partial_lse.stride(0),
        partial_lse.stride(1), head_dim,
        GROUP=group, BLOCK_H=_BLOCK_H, BLOCK_D=block_d, BLOCK_N=config.block_n, FP32_DOT=exact_fp32_dot(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    _decode_stage2_kernel[(batch, num_heads)](
        partial_out, partial_lse, out, kv_indptr, num_kv_splits,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), partial_lse.stride(0),
        partial_lse.stride(1), out.stride(0), out.stride(1),
        head_dim, BLOCK_D=block_d, BLOCK_N=config.block_n,
    )
