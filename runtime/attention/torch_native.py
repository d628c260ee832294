"""Attention with torch's scaled_dot_product_attention over K/V from the paged pool (CPU and CUDA).

Decode reads the running requests' K/V from a dense arena, [rows, kv_heads, capacity, dim] per layer, in which
each request owns one row for its whole life: a new request's cached tokens are gathered from the pool once,
each step appends one token per row, and a finished request's row is filled by moving the last one, so live
rows are always [0, n) and attention reads them in place. Gathering every request's scattered slots every step
would read each byte twice. Above DECODE_ARENA_BUDGET_BYTES decode falls back to that gather.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from toolkit.runtime.attention.base import AttentionBackend, AttentionLayer
from toolkit.runtime.forward_batch import ForwardBatch

DECODE_ARENA_BUDGET_BYTES = 1 << 30
ARENA_LENGTH_HEADROOM = 128  # tokens added when the arena grows, so most steps only append


@dataclass
class _DecodeMetadata:
    mask: torch.Tensor  # [batch, 1, 1, max_len] True where a token is real (arena row order when arena rows exist)
    positions: torch.Tensor  # [batch] where each request's new token goes (batch order)
    max_len: int
    kv_slots: torch.Tensor | None = None  # gather path: [batch, max_len] slots, padded with slot 0
    rows: torch.Tensor | None = None  # arena path: the arena row of each request (batch order)


@dataclass
class _ExtendMetadata:
    kv_slots: list[torch.Tensor]  # per request: slots of all its tokens (prefix + new)
    token_offsets: list[int]  # per request: first row of its new tokens in the flattened batch


class _DecodeArena:
    """Per-layer dense K/V of the running requests, one row per request, live rows packed at [0, n)."""

    def __init__(self) -> None:
        self.row_of: dict[str, int] = {}
        self.cached: dict[str, int] = {}  # tokens of each request held in its row
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k[0].shape[0], self.k[0].shape[2]) if self.k else (0, 0)

    def clear(self) -> None:
        self.__init__()

    def sync(self, batch: ForwardBatch) -> torch.Tensor:
        """Make the arena hold exactly this batch's requests; returns each request's row (batch order)."""
        ids = batch.request_ids
        for rid in [r for r in self.row_of if r not in set(ids)]:
            self._release(rid)
        self._ensure_capacity(batch, len(ids), max(batch.seq_lens_cpu))
        stale = []
        for rid, length in zip(ids, batch.seq_lens_cpu):
            if rid not in self.row_of:
                self.row_of[rid] = len(self.row_of)
                stale.append(rid)
            elif self.cached[rid] != length - 1:  # it grew outside decode (a mixed prefill step)
                stale.append(rid)
        self._gather(batch, set(stale))
        for rid, length in zip(ids, batch.seq_lens_cpu):
            self.cached[rid] = length
        return torch.tensor([self.row_of[rid] for rid in ids], device=batch.seq_lens.device)

    def _release(self, rid: str) -> None:
        row, last = self.row_of.pop(rid), len(self.row_of)
        del self.cached[rid]
        if row == last:
            return
        mover = next(r for r, i in self.row_of.items() if i == last)
        for buffers in (self.k, self.v):
            for buffer in buffers:
                buffer[row] = buffer[last]
        self.row_of[mover] = row

    def _ensure_capacity(self, batch: ForwardBatch, rows: int, length: int) -> None:
        have_rows, have_len = self.shape
        if rows <= have_rows and length <= have_len:
            return
        new_rows = max(rows, have_rows + have_rows // 4)
        new_len = max(length + ARENA_LENGTH_HEADROOM, have_len + have_len // 4)
        live = len(self.row_of)
        pool = batch.kv_pool
        self.k = [self._grown(old, buf, new_rows, new_len, live) for old, buf in zip(self.k or [None] * len(pool.k_buffer), pool.k_buffer)]
        self.v = [self._grown(old, buf, new_rows, new_len, live) for old, buf in zip(self.v or [None] * len(pool.v_buffer), pool.v_buffer)]

    @staticmethod
    def _grown(old: torch.Tensor | None, pool_buffer: torch.Tensor, rows: int, length: int, live: int) -> torch.Tensor:
        arena = pool_buffer.new_zeros(rows, pool_buffer.shape[1], length, pool_buffer.shape[2])
        if old is not None and live:
            arena[:live, :, : old.shape[2]] = old[:live]
        return arena

    def _gather(self, batch: ForwardBatch, stale: set[str]) -> None:
        """Copy the cached tokens (all but the new one) of `stale` requests from the pool into their rows."""
        picks = [i for i, rid in enumerate(batch.request_ids) if rid in stale]
        if not picks:
            return
        cached = [batch.seq_lens_cpu[i] - 1 for i in picks]
        width = max(cached)
        pool_rows = batch.req_pool_indices[picks]
        slots = batch.req_to_token[pool_rows, :width].to(torch.int64)
        slots = slots.masked_fill(torch.arange(width, device=slots.device)[None, :] >= torch.tensor(
            cached, device=slots.device)[:, None], 0)
        rows = torch.tensor([self.row_of[batch.request_ids[i]] for i in picks], device=slots.device)
        flat = slots.reshape(-1)
        for arena, buffer in zip(self.k + self.v, batch.kv_pool.k_buffer + batch.kv_pool.v_buffer):
            gathered = buffer.index_select(0, flat).view(len(picks), width, buffer.shape[1], buffer.shape[2])
            arena[rows, :, :width] = gathered.transpose(1, 2)


def arena_bytes(batch: ForwardBatch) -> int:
    k = batch.kv_pool.k_buffer[0]
    per_token = 2 * len(batch.kv_pool.k_buffer) * k.shape[1] * k.shape[2] * k.element_size()
    return per_token * batch.batch_size * (max(batch.seq_lens_cpu) + ARENA_LENGTH_HEADROOM)


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def __init__(self) -> None:
        self._arena = _DecodeArena()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = self._decode_metadata(batch)
        else:
            batch.attn_metadata = self._extend_metadata(batch)

    def _decode_metadata(self, batch: ForwardBatch) -> _DecodeMetadata:
        max_len = max(batch.seq_lens_cpu)
        positions = batch.seq_lens - 1
        if batch.request_ids is None or arena_bytes(batch) > DECODE_ARENA_BUDGET_BYTES:
            self._arena.clear()
            real = torch.arange(max_len, device=positions.device)[None, :] < batch.seq_lens[:, None]
            slots = batch.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64).masked_fill(~real, 0)
            return _DecodeMetadata(real[:, None, None, :], positions, max_len, kv_slots=slots)
        rows = self._arena.sync(batch)
        lengths = torch.empty_like(batch.seq_lens)
        lengths[rows] = batch.seq_lens
        real = torch.arange(max_len, device=positions.device)[None, :] < lengths[:, None]
        return _DecodeMetadata(real[:, None, None, :], positions, max_len, rows=rows)

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
        if meta.rows is None:
            keys = batch.kv_pool.k_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
            values = batch.kv_pool.v_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
            return self._attend(q, keys, values, meta.mask, layer)
        arena_k, arena_v = self._arena.k[layer.layer_id], self._arena.v[layer.layer_id]
        arena_k[meta.rows, :, meta.positions] = k.to(arena_k.dtype)
        arena_v[meta.rows, :, meta.positions] = v.to(arena_v.dtype)
        live = len(meta.rows)
        in_row_order = torch.empty_like(q)
        in_row_order[meta.rows] = q
        out = self._attend(in_row_order, arena_k[:live, :, : meta.max_len], arena_v[:live, :, : meta.max_len],
                           meta.mask, layer)
        return out[meta.rows]

    @staticmethod
    def _attend(q, keys, values, mask, layer: AttentionLayer) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=layer.scaling,
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        )
        return out.squeeze(2)

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
