"""Attention with torch ops over K/V in the paged pool (CPU and CUDA).

Decode on CPU reads each request's K/V in place from the pool with a native kernel (`runtime/kernels`): no copy of
the cache exists outside the pool, so `#token` and `token usage` describe all the KV memory held. Elsewhere (CUDA,
or a CPU where the kernel cannot be built) decode gathers each request's slots and calls SDPA. Extend attends per
request with SDPA: over the new tokens alone when nothing is cached, else over the prefix gathered from the pool.
With the kernels, the bf16 extends with nothing cached attend in one native call for the whole batch instead, and
an extend of one token on a cached prefix is a decode (what `--enable-mixed-chunk` folds into a prefill): all such
rows of a batch attend in one call, in place, like a decode step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from toolkit.runtime import kernels as cpu_kernels
from toolkit.runtime.attention.base import AttentionBackend, AttentionLayer
from toolkit.runtime.forward_batch import ForwardBatch



@dataclass
class _GatherMetadata:
    """Decode without the native kernel: every request's slots, padded with slot 0, and which are real."""

    kv_slots: torch.Tensor  # [batch, max_len]
    mask: torch.Tensor  # [batch, 1, 1, max_len]


@dataclass
class _DecodeRows:
    """The one-token extends on a cached prefix that the native kernel attends in one call."""

    rows: torch.Tensor  # [n] their rows in the flattened batch
    req_pool_indices: torch.Tensor  # [n]
    seq_lens: torch.Tensor  # [n]


@dataclass
class _NewSequences:
    """The extends with nothing cached, which the native kernel attends in one call where q is bf16."""

    starts: torch.Tensor  # [n] int64: first row of each in the flattened batch
    lengths: torch.Tensor  # [n] int64


@dataclass
class _ExtendMetadata:
    requests: list[int]  # the requests attended one by one with SDPA (all of them without the kernels)
    kv_slots: list[torch.Tensor]  # per request in `requests`: slots of all its tokens (prefix + new)
    token_offsets: list[int]  # per request in `requests`: first row of its new tokens in the flattened batch
    decode_rows: _DecodeRows | None
    new_sequences: _NewSequences | None  # those of `requests` with nothing cached (with the kernels)


def _native_kernel_ready(device: torch.device) -> bool:
    """Where it is not (no compiler), CPU decode gathers the cache for SDPA instead (slower)."""
    return device.type == "cpu" and cpu_kernels.available()


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def __init__(self, device: torch.device | str = "cpu", in_place_decode: bool | None = None) -> None:
        """`in_place_decode` None: the native kernel wherever it can run; False forces the gather + SDPA path."""
        ready = _native_kernel_ready(torch.device(device)) if in_place_decode is not False else False
        self.in_place_decode = ready

    @property
    def supports_cuda_graph(self) -> bool:
        """A padded, replayable decode step: the in-place kernel reads its metadata straight from the batch's
        persistent tensors, so a CPU's compiled decode step (no CUDA graphs here) can be replayed."""
        return self.in_place_decode

    def init_cuda_graph_state(self, batch_sizes: list[int], max_context_len: int) -> None:
        pass

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = None

    def init_forward_metadata_replay_cuda_graph(self, batch: ForwardBatch, num_real: int) -> None:
        batch.attn_metadata = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = None if self.in_place_decode else self._gather_metadata(batch)
        else:
            batch.attn_metadata = self._extend_metadata(batch, self.in_place_decode)

    @staticmethod
    def _gather_metadata(batch: ForwardBatch) -> _GatherMetadata:
        max_len = max(batch.seq_lens_cpu)
        real = torch.arange(max_len, device=batch.seq_lens.device)[None, :] < batch.seq_lens[:, None]
        slots = batch.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64).masked_fill(~real, 0)
        return _GatherMetadata(slots, real[:, None, None, :])

    @staticmethod
    def _extend_metadata(batch: ForwardBatch, in_place_decode: bool) -> _ExtendMetadata:
        requests, slots, offsets, decode_requests, decode_offsets, offset = [], [], [], [], [], 0
        for i, seq_len in enumerate(batch.seq_lens_cpu):
            new_tokens = batch.extend_seq_lens_cpu[i]
            if in_place_decode and new_tokens == 1 and batch.extend_prefix_lens_cpu[i] > 0:
                decode_requests.append(i)
                decode_offsets.append(offset)
            else:
                requests.append(i)
                slots.append(batch.req_to_token[batch.req_pool_indices_cpu[i], :seq_len].to(torch.int64))
                offsets.append(offset)
            offset += new_tokens
        decode_rows = None
        if decode_requests:
            picked = torch.tensor(decode_requests, dtype=torch.int64, device=batch.seq_lens.device)
            decode_rows = _DecodeRows(torch.tensor(decode_offsets, dtype=torch.int64, device=picked.device),
                                      batch.req_pool_indices[picked], batch.seq_lens[picked])
        new_sequences = None
        new = [(offset, batch.extend_seq_lens_cpu[i]) for i, offset in zip(requests, offsets)
               if batch.extend_prefix_lens_cpu[i] == 0]
        if in_place_decode and new:
            starts, lengths = torch.tensor(new, dtype=torch.int64).T
            new_sequences = _NewSequences(starts.contiguous(), lengths.contiguous())
        return _ExtendMetadata(requests, slots, offsets, decode_rows, new_sequences)

    def forward_decode(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        pool, layer_id = batch.kv_pool, layer.layer_id
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        if self.in_place_decode:
            return self._decode_in_place(q, layer, batch, batch.req_pool_indices, batch.seq_lens)
        meta: _GatherMetadata = batch.attn_metadata
        keys = pool.k_buffer[layer_id][meta.kv_slots].transpose(1, 2).to(q.dtype)
        values = pool.v_buffer[layer_id][meta.kv_slots].transpose(1, 2).to(q.dtype)
        scaling, v_scale = _scales(pool, layer)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=meta.mask, scale=scaling,
                                             enable_gqa=layer.num_heads != layer.num_kv_heads).squeeze(2)
        return out if v_scale == 1.0 else out.mul_(v_scale)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        meta: _ExtendMetadata = batch.attn_metadata
        k_buffer = batch.kv_pool.k_buffer[layer.layer_id]
        v_buffer = batch.kv_pool.v_buffer[layer.layer_id]
        out = torch.empty_like(q)
        native_new = meta.new_sequences is not None and cpu_kernels.prefill_attention_applies(q, k, v)
        if native_new:
            cpu_kernels.prefill_attention(q, k, v, meta.new_sequences.starts, meta.new_sequences.lengths,
                                          layer.scaling, out)
        for i, slots, start in zip(meta.requests, meta.kv_slots, meta.token_offsets):
            length, prefix = batch.extend_seq_lens_cpu[i], batch.extend_prefix_lens_cpu[i]
            if native_new and prefix == 0:
                continue
            queries = q[start : start + length].transpose(0, 1).unsqueeze(0)
            if prefix == 0:  # nothing cached: the new K/V are the whole sequence
                keys, values = k[start : start + length], v[start : start + length]
            else:
                keys, values = _read_pool(k_buffer, v_buffer, slots, q.dtype, batch.kv_pool, layer.layer_id)
            keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
            out[start : start + length] = _causal_attention(queries, keys, values, prefix, layer)[0].transpose(0, 1)
        if meta.decode_rows is not None:
            out[meta.decode_rows.rows] = self._decode_in_place(q[meta.decode_rows.rows], layer, batch,
                                                               meta.decode_rows.req_pool_indices,
                                                               meta.decode_rows.seq_lens)
        return out

    @staticmethod
    def _decode_in_place(q: torch.Tensor, layer: AttentionLayer, batch: ForwardBatch, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor) -> torch.Tensor:
        """One query row per request over its whole cached sequence, read in place by the native kernel."""
        pool, layer_id = batch.kv_pool, layer.layer_id
        scaling, v_scale = _scales(pool, layer)
        out = cpu_kernels.paged_decode_attention(q, pool.k_buffer[layer_id], pool.v_buffer[layer_id],
                                                 batch.req_to_token, req_pool_indices, seq_lens, scaling)
        return out if v_scale == 1.0 else out.mul_(v_scale)


def _scales(pool, layer: AttentionLayer) -> tuple[float, float]:
    """The softmax scale and the output's scale of a decode over the pool: an fp8 pool holds K/k_scale and
    V/v_scale, so k_scale folds into the softmax scale and v_scale multiplies the output."""
    return layer.scaling * pool.k_scales[layer.layer_id], pool.v_scales[layer.layer_id]


def _read_pool(k_buffer: torch.Tensor, v_buffer: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype, pool,
               layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = k_buffer[slots].to(dtype), v_buffer[slots].to(dtype)
    k_scale, v_scale = pool.k_scales[layer_id], pool.v_scales[layer_id]
    return (keys if k_scale == 1.0 else keys.mul_(k_scale)), (values if v_scale == 1.0 else values.mul_(v_scale))


def _causal_attention(q, k, v, prefix_len: int, layer: AttentionLayer) -> torch.Tensor:
    gqa = layer.num_heads != layer.num_kv_heads
    if prefix_len == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scaling, enable_gqa=gqa)
    new_len, total = q.shape[2], k.shape[2]
    query_pos = torch.arange(prefix_len, prefix_len + new_len, device=q.device)
    mask = torch.arange(total, device=q.device)[None, :] <= query_pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa)
