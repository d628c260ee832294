"""Attention with torch's scaled_dot_product_attention over K/V from the paged pool (CPU and CUDA).

Decode keeps the running batch's K/V in a dense per-layer copy, [batch, kv_heads, capacity, dim], extended in
place each step: steady-state decode then reads each cached byte once instead of gathering it from scattered
slots every step. The copy is rebuilt (one gather) whenever the batch's requests change, and skipped when it
would exceed DENSE_DECODE_BUDGET_BYTES.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.attention.base import AttentionBackend, AttentionLayer
from runtime.forward_batch import ForwardBatch

DENSE_DECODE_BUDGET_BYTES = 1 << 30
DENSE_CAPACITY_STEP = 128  # tokens of headroom added per rebuild, so most steps only append


@dataclass
class _DecodeMetadata:
    kv_slots: torch.Tensor | None  # [batch, max_len] slots, padded with slot 0 (when not using the dense copy)
    mask: torch.Tensor  # [batch, 1, 1, max_len] True where a token is real
    positions: torch.Tensor  # [batch] where each request's new token goes
    max_len: int
    dense: bool


@dataclass
class _ExtendMetadata:
    kv_slots: list[torch.Tensor]  # per request: slots of all its tokens (prefix + new)
    token_offsets: list[int]  # per request: first row of its new tokens in the flattened batch


class _DenseDecodeCache:
    """The running batch's K/V, contiguous per request and layer."""

    def __init__(self) -> None:
        self.request_ids: tuple[str, ...] | None = None
        self.lengths: list[int] = []
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def can_extend(self, batch: ForwardBatch) -> bool:
        return (
            batch.request_ids is not None
            and batch.request_ids == self.request_ids
            and all(new == old + 1 for new, old in zip(batch.seq_lens_cpu, self.lengths))
            and max(batch.seq_lens_cpu) <= self.capacity
        )

    def rebuild(self, batch: ForwardBatch) -> None:
        """Gather the cached tokens (all but each request's new one) from the pool."""
        pool = batch.kv_pool
        capacity = max(batch.seq_lens_cpu) + DENSE_CAPACITY_STEP
        cached = [length - 1 for length in batch.seq_lens_cpu]
        rows = batch.req_to_token[batch.req_pool_indices, : max(max(cached), 1)].to(torch.int64)
        rows = rows.masked_fill(torch.arange(rows.shape[1], device=rows.device)[None, :] >= torch.tensor(
            cached, device=rows.device)[:, None], 0)
        self.k, self.v = [], []
        for k_buffer, v_buffer in zip(pool.k_buffer, pool.v_buffer):
            self.k.append(self._dense(k_buffer, rows, capacity))
            self.v.append(self._dense(v_buffer, rows, capacity))
        self.request_ids = batch.request_ids
        self.lengths = list(batch.seq_lens_cpu)

    @staticmethod
    def _dense(buffer: torch.Tensor, rows: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, length = rows.shape
        dense = buffer.new_zeros(batch, buffer.shape[1], capacity, buffer.shape[2])
        gathered = buffer.index_select(0, rows.reshape(-1)).view(batch, length, buffer.shape[1], buffer.shape[2])
        dense[:, :, :length] = gathered.transpose(1, 2)
        return dense

    def advance(self, batch: ForwardBatch) -> None:
        self.lengths = list(batch.seq_lens_cpu)

    def clear(self) -> None:
        self.__init__()


def dense_bytes(batch: ForwardBatch) -> int:
    k = batch.kv_pool.k_buffer[0]
    per_token = 2 * len(batch.kv_pool.k_buffer) * k.shape[1] * k.shape[2] * k.element_size()
    return per_token * batch.batch_size * (max(batch.seq_lens_cpu) + DENSE_CAPACITY_STEP)


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def __init__(self) -> None:
        self._dense = _DenseDecodeCache()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = self._decode_metadata(batch)
        else:
            self._dense.clear()
            batch.attn_metadata = self._extend_metadata(batch)

    def _decode_metadata(self, batch: ForwardBatch) -> _DecodeMetadata:
        max_len = max(batch.seq_lens_cpu)
        positions = batch.seq_lens - 1
        real = torch.arange(max_len, device=positions.device)[None, :] < batch.seq_lens[:, None]
        use_dense = batch.request_ids is not None and dense_bytes(batch) <= DENSE_DECODE_BUDGET_BYTES
        if not use_dense:
            self._dense.clear()
            rows = batch.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64)
            return _DecodeMetadata(rows.masked_fill(~real, 0), real[:, None, None, :], positions, max_len, False)
        if self._dense.can_extend(batch):
            self._dense.advance(batch)
        else:
            self._dense.rebuild(batch)
        return _DecodeMetadata(None, real[:, None, None, :], positions, max_len, True)

    @staticmethod
    def _extend_metadata(batch: ForwardBatch) -> _ExtendMetadata:
        slots, offsets, offset = [], [], 0
        for i, seq_len in enumerate(batch.seq_lens_cpu):
            row = batch.req_pool_indices_cpu[i]
            slots.append(batch.req_to_token[row, :seq_len].to(torch.int64))
            offsets.append(offset)
            offset += batch.extend_seq_lens_cpu[i]
        return _ExtendMetadata(kv_slots=slots, token_offsets=offsets)

    def forward_decode(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        meta: _DecodeMetadata = batch.attn_metadata
        if meta.dense:
            keys, values = self._append_dense(layer.layer_id, meta, k, v)
        else:
            keys = batch.kv_pool.k_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
            values = batch.kv_pool.v_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.to(q.dtype), values.to(q.dtype), attn_mask=meta.mask,
            scale=layer.scaling, enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return out.squeeze(2)

    def _append_dense(self, layer_id: int, meta: _DecodeMetadata, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        dense_k, dense_v = self._dense.k[layer_id], self._dense.v[layer_id]
        rows = torch.arange(dense_k.shape[0], device=dense_k.device)
        dense_k[rows, :, meta.positions] = k.to(dense_k.dtype)
        dense_v[rows, :, meta.positions] = v.to(dense_v.dtype)
        return dense_k[:, :, : meta.max_len], dense_v[:, :, : meta.max_len]

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        meta: _ExtendMetadata = batch.attn_metadata
        k_buffer = batch.kv_pool.k_buffer[layer.layer_id]
        v_buffer = batch.kv_pool.v_buffer[layer.layer_id]
        out = torch.empty_like(q)
        for i, slots in enumerate(meta.kv_slots):
            start, length = meta.token_offsets[i], batch.extend_seq_lens_cpu[i]
            prefix = batch.extend_prefix_lens_cpu[i]
            queries = q[start : start + length].transpose(0, 1).unsqueeze(0)
            if prefix == 0 and k.dtype == k_buffer.dtype:  # nothing cached: the new K/V are the whole sequence
                keys, values = k[start : start + length], v[start : start + length]
            else:
                keys, values = k_buffer[slots].to(q.dtype), v_buffer[slots].to(q.dtype)
            keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
            out[start : start + length] = _causal_attention(queries, keys, values, prefix, layer)[0].transpose(0, 1)
        return out


def _causal_attention(q, k, v, prefix_len: int, layer: AttentionLayer) -> torch.Tensor:
    gqa = layer.num_heads != layer.num_kv_heads
    if prefix_len == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scaling, enable_gqa=gqa)
    new_len, total = q.shape[2], k.shape[2]
    query_pos = torch.arange(prefix_len, prefix_len + new_len, device=q.device)
    mask = torch.arange(total, device=q.device)[None, :] <= query_pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa)
