"""Attention with torch's scaled_dot_product_attention over K/V gathered from the paged pool (CPU and CUDA)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.attention.base import AttentionBackend, AttentionLayer
from runtime.forward_batch import ForwardBatch


@dataclass
class _DecodeMetadata:
    kv_slots: torch.Tensor  # [batch, max_len] slot of each cached token, padded with slot 0
    mask: torch.Tensor  # [batch, 1, 1, max_len] True where a token is real


@dataclass
class _ExtendMetadata:
    kv_slots: list[torch.Tensor]  # per request: slots of all its tokens (prefix + new)
    token_offsets: list[int]  # per request: first row of its new tokens in the flattened batch


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = self._decode_metadata(batch)
        else:
            batch.attn_metadata = self._extend_metadata(batch)

    @staticmethod
    def _decode_metadata(batch: ForwardBatch) -> _DecodeMetadata:
        max_len = max(batch.seq_lens_cpu)
        rows = batch.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64)
        real = torch.arange(max_len, device=rows.device)[None, :] < batch.seq_lens[:, None]
        return _DecodeMetadata(kv_slots=rows.masked_fill(~real, 0), mask=real[:, None, None, :])

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
        keys = batch.kv_pool.k_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
        values = batch.kv_pool.v_buffer[layer.layer_id][meta.kv_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.to(q.dtype), values.to(q.dtype), attn_mask=meta.mask,
            scale=layer.scaling, enable_gqa=layer.num_heads != layer.num_kv_heads,
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
