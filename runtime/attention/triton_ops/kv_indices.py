"""Flatten each request's slots from the req_to_token table into one ragged index array (CSR by kv_indptr)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512


@triton.jit
def _create_kv_indices_kernel(
    ReqToToken, ReqPoolIndices, KvIndptr, KvIndices, stride_row, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    row = tl.load(ReqPoolIndices + req).to(tl.int64)
    start = tl.load(KvIndptr + req)
    length = tl.load(KvIndptr + req + 1) - start
    for offset in range(0, length, BLOCK):
        offs = offset + tl.arange(0, BLOCK)
        mask = offs < length
        slots = tl.load(ReqToToken + row * stride_row + offs, mask=mask)
        tl.store(KvIndices + start + offs, slots, mask=mask)


def create_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    total: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """kv_indices[kv_indptr[i] + j] = req_to_token[req_pool_indices[i], j] for j < kv_indptr[i+1] - kv_indptr[i].

    `total` is kv_indptr[-1], known on the host; the result has at least one element (kernels may take its
    address even when it is empty). `out`, an int32 buffer of at least `total` elements, is written in place
    and returned (CUDA graphs read a persistent buffer)."""
    if out is None:
        kv_indices = torch.empty(max(total, 1), dtype=torch.int32, device=req_to_token.device)
    else:
        assert out.numel() >= total, f"kv_indices buffer of {out.numel()} slots cannot hold {total}"
        kv_indices = out
    batch = req_pool_indices.numel()
    if batch and total:
        _create_kv_indices_kernel[(batch,)](
            req_to_token, req_pool_indices, kv_indptr, kv_indices, req_to_token.stride(0), BLOCK=_BLOCK,
        )
    return kv_indices
