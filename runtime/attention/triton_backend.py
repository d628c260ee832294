"""Attention with Triton kernels over the paged KV pool: split-KV decode and ragged causal extend.

Per-batch metadata (CSR indptr/indices of every request's slots, KV splits, scratch for partial outputs) is built
once in `init_forward_metadata` and shared by all layers. Decode CUDA graphs read the same metadata from
persistent buffers, refreshed in place before each replay; each captured size launches a fixed number of KV
splits (the grid), and each request uses as many of them as an eager step of the real batch would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
import triton

from toolkit.runtime.attention.base import AttentionBackend, AttentionLayer
from toolkit.runtime.attention.triton_ops.decode_attention import DecodeConfig, decode_attention
from toolkit.runtime.attention.triton_ops.extend_attention import ExtendConfig, extend_attention
from toolkit.runtime.attention.triton_ops.kv_indices import create_kv_indices
from toolkit.runtime.attention.triton_ops.kv_store import store_kv
from toolkit.runtime.attention.triton_ops.utils import KERNELS_INTERPRETED
from toolkit.runtime.forward_batch import ForwardBatch


@dataclass
class TritonDecodeMetadata:
    kv_indptr: torch.Tensor  # [batch + 1] int32, CSR offsets into kv_indices
    kv_indices: torch.Tensor  # [sum(seq_lens)] int32 slots, request by request
    num_kv_splits: torch.Tensor  # [batch] int32, 1..max_kv_splits
    max_kv_splits: int
    scratch: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def partials(self, num_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 partial outputs and log-sum-exps per split, allocated once per batch and reused by layers."""
        key = (num_heads, head_dim)
        if key not in self.scratch:
            batch, device = self.num_kv_splits.numel(), self.kv_indices.device
            out = torch.empty(batch, num_heads, self.max_kv_splits, head_dim, dtype=torch.float32, device=device)
            lse = torch.empty(batch, num_heads, self.max_kv_splits, dtype=torch.float32, device=device)
            self.scratch[key] = (out, lse)
        return self.scratch[key]


@dataclass
class TritonExtendMetadata:
    qo_indptr: torch.Tensor  # [batch + 1] int32, CSR offsets of each request's new tokens in the batch
    kv_indptr: torch.Tensor  # [batch + 1] int32, CSR offsets into kv_indices (prefix + new tokens)
    kv_indices: torch.Tensor  # [sum(seq_lens)] int32 slots
    max_extend_len: int


@dataclass
class TritonGraphBuffers:
    """Persistent decode metadata shared by every captured batch size (graphs replay one at a time)."""

    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    kv_indices: torch.Tensor  # [max_bs * max_context_len] int32
    num_kv_splits: torch.Tensor  # [max_bs] int32
    max_context_len: int
    smallest_real: dict[int, int]  # captured size -> the smallest real batch padded to it
    split_capacity: dict[int, int] = field(default_factory=dict)  # captured size -> KV splits in its grid

    @classmethod
    def allocate(cls, batch_sizes: list[int], max_context_len: int, device: torch.device) -> TritonGraphBuffers:
        max_bs = batch_sizes[-1]
        smallest_real = {bs: previous + 1 for previous, bs in zip([0, *batch_sizes], batch_sizes)}
        return cls(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=device),
            num_kv_splits=torch.ones(max_bs, dtype=torch.int32, device=device),
            max_context_len=max_context_len,
            smallest_real=smallest_real,
        )


def check_triton_runnable(device: torch.device) -> None:
    """Raise a clear error when Triton kernels cannot run on `device`."""
    if device.type == "cpu" and not KERNELS_INTERPRETED:
        raise RuntimeError(
            "--attention-backend triton on CPU needs Triton's interpreter: set TRITON_INTERPRET=1 in the "
            "environment before starting (slow; meant for tests), or use --attention-backend torch_native"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"--attention-backend triton supports CUDA devices, not {device.type}")


class TritonBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graph = True

    def __init__(
        self,
        device: torch.device,
        max_kv_splits: int = 32,
        min_split_tokens: int = 256,
        decode_config: DecodeConfig = DecodeConfig(),
        extend_config: ExtendConfig = ExtendConfig(),
    ) -> None:
        check_triton_runnable(device)
        self.device = torch.device(device)
        self.max_kv_splits = max_kv_splits
        self.min_split_tokens = min_split_tokens
        self.decode_config = decode_config
        self.extend_config = extend_config
        # NOTE: splits only pay while batch × KV heads leaves SMs idle; ~4 programs per SM are enough.
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
        self.target_programs = 4 * sms if sms else None
        self.graph_buffers: TritonGraphBuffers | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        kv_indptr = _indptr(batch.seq_lens)
        kv_indices = create_kv_indices(batch.req_to_token, batch.req_pool_indices, kv_indptr, sum(batch.seq_lens_cpu))
        if batch.mode.is_decode:
            max_splits = self._max_kv_splits(batch.batch_size, _num_kv_heads(batch), max(batch.seq_lens_cpu))
            num_kv_splits = self._num_kv_splits(batch.seq_lens, max_splits).to(torch.int32)
            batch.attn_metadata = TritonDecodeMetadata(kv_indptr, kv_indices, num_kv_splits, max_splits)
        else:
            qo_indptr = torch.tensor([0, *accumulate(batch.extend_seq_lens_cpu)], dtype=torch.int32,
                                     device=kv_indptr.device)
            max_extend_len = max(batch.extend_seq_lens_cpu, default=0)
            batch.attn_metadata = TritonExtendMetadata(qo_indptr, kv_indptr, kv_indices, max_extend_len)

    def init_cuda_graph_state(self, batch_sizes: list[int], max_context_len: int) -> None:
        self.graph_buffers = TritonGraphBuffers.allocate(sorted(batch_sizes), max_context_len, self.device)

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        buffers, bs = self.graph_buffers, batch.batch_size
        # NOTE: the grid must fit the most splits any real batch padded to bs gets; the smallest gets the most.
        capacity = self._max_kv_splits(buffers.smallest_real[bs], _num_kv_heads(batch), buffers.max_context_len)
        buffers.split_capacity[bs] = capacity
        batch.attn_metadata = TritonDecodeMetadata(
            buffers.kv_indptr[: bs + 1], buffers.kv_indices, buffers.num_kv_splits[:bs], capacity
        )
        self.init_forward_metadata_replay_cuda_graph(batch, bs)

    def init_forward_metadata_replay_cuda_graph(self, batch: ForwardBatch, num_real: int) -> None:
        buffers, bs = self.graph_buffers, batch.batch_size
        kv_indptr = buffers.kv_indptr[: bs + 1]
        kv_indptr[1:].copy_(torch.cumsum(batch.seq_lens, 0))
        create_kv_indices(batch.req_to_token, batch.req_pool_indices, kv_indptr, sum(batch.seq_lens_cpu),
                          out=buffers.kv_indices)
        capacity = buffers.split_capacity[bs]
        real_max = self._max_kv_splits(num_real, _num_kv_heads(batch), max(batch.seq_lens_cpu[:num_real]))
        buffers.num_kv_splits[:bs].copy_(self._num_kv_splits(batch.seq_lens, min(real_max, capacity)))

    def _num_kv_splits(self, seq_lens: torch.Tensor, max_splits: int) -> torch.Tensor:
        """Splits of each request: one per min_split_tokens of its KV, 1..max_splits."""
        return ((seq_lens + self.min_split_tokens - 1) // self.min_split_tokens).clamp_(1, max_splits)

    def _max_kv_splits(self, batch_size: int, num_kv_heads: int, max_seq_len: int) -> int:
        """Splits per request at most: enough to fill the GPU, none shorter than min_split_tokens."""
        cap = min(self.max_kv_splits, triton.cdiv(max_seq_len, self.min_split_tokens))
        if self.target_programs is not None:
            cap = min(cap, triton.cdiv(self.target_programs, batch_size * num_kv_heads))
        return max(1, cap)

    def forward_decode(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        k_buffer, v_buffer = self._store(k, v, layer, batch)
        meta: TritonDecodeMetadata = batch.attn_metadata
        partial_out, partial_lse = meta.partials(layer.num_heads, layer.head_dim)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_scale, v_scale = _scales(batch, layer)
        decode_attention(
            q, k_buffer, v_buffer, out, meta.kv_indptr, meta.kv_indices, meta.num_kv_splits,
            partial_out, partial_lse, layer.scaling * k_scale, self.decode_config,
        )
        return out if v_scale == 1.0 else out.mul_(v_scale)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        k_buffer, v_buffer = self._store(k, v, layer, batch)
        meta: TritonExtendMetadata = batch.attn_metadata
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_scale, v_scale = _scales(batch, layer)
        extend_attention(
            q, k_buffer, v_buffer, out, meta.qo_indptr, meta.kv_indptr, meta.kv_indices,
            meta.max_extend_len, layer.scaling * k_scale, self.extend_config,
        )
        return out if v_scale == 1.0 else out.mul_(v_scale)

    @staticmethod
    def _store(k, v, layer: AttentionLayer, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        pool, layer_id = batch.kv_pool, layer.layer_id
        k_buffer, v_buffer = pool.k_buffer[layer_id], pool.v_buffer[layer_id]
        store_kv(k_buffer, v_buffer, batch.out_cache_loc, k, v, pool.k_scales[layer_id], pool.v_scales[layer_id])
        return k_buffer, v_buffer


def _scales(batch: ForwardBatch, layer: AttentionLayer) -> tuple[float, float]:
    """An fp8 pool holds K/k_scale and V/v_scale: k_scale folds into the softmax scale, v_scale into the output."""
    return batch.kv_pool.k_scales[layer.layer_id], batch.kv_pool.v_scales[layer.layer_id]


def _num_kv_heads(batch: ForwardBatch) -> int:
    return batch.kv_pool.k_buffer[0].shape[1]


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    indptr = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    indptr[1:] = torch.cumsum(lengths, 0)
    return indptr
