"""Attention with FlashInfer (CUDA): paged decode, and ragged prefill of the new tokens merged with a paged pass
over the cached prefix, as SGLang does. The pool is addressed token by token (FlashInfer page size 1), so any
`--page-size` works.

Wrappers are planned once per batch, on the first layer (the plan needs the layer's head geometry and scale).
Decode CUDA graphs get one graph-mode decode wrapper per captured size over persistent indptr/indices buffers; it
is re-planned eagerly before each replay with the geometry recorded while capturing.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import torch

from toolkit.runtime.attention.base import AttentionBackend, AttentionLayer
from toolkit.runtime.attention.triton_ops.kv_indices import create_kv_indices
from toolkit.runtime.forward_batch import ForwardBatch

WORKSPACE_BYTES = 256 << 20
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
_SUPPORTED_HEAD_DIMS = (64, 128, 256)


@dataclass
class FlashInferMetadata:
    qo_indptr: torch.Tensor | None  # [batch + 1] int32 offsets of the new tokens (extend only)
    kv_indptr: torch.Tensor  # [batch + 1] int32 offsets into kv_indices
    kv_indices: torch.Tensor  # int32 slots: all tokens (decode) or the cached prefixes (extend)
    kv_last_page_len: torch.Tensor  # [batch] int32 ones: every slot is its own page
    has_prefix: bool
    planned: set[tuple[int, int, float]] = field(default_factory=set)
    graph_bs: int | None = None  # set for a captured decode batch: use that size's graph-mode wrapper


@dataclass
class FlashInferGraphBuffers:
    """Persistent decode metadata the graph-mode wrappers read (shared: graphs replay one at a time)."""

    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    kv_indices: torch.Tensor  # [max_bs * max_context_len] int32
    kv_last_page_len: torch.Tensor  # [max_bs] int32 ones
    wrappers: dict[int, Any] = field(default_factory=dict)  # captured size -> graph-mode decode wrapper
    plan: tuple[AttentionLayer, torch.dtype, torch.dtype] | None = None  # (layer, q dtype, kv dtype) seen

    @classmethod
    def allocate(cls, max_bs: int, max_context_len: int, device: torch.device) -> FlashInferGraphBuffers:
        return cls(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
        )


def check_flashinfer_usable(device: torch.device) -> None:
    """Raise a clear error when FlashInfer cannot run here."""
    if importlib.util.find_spec("flashinfer") is None:
        raise RuntimeError(
            "--attention-backend flashinfer needs the `flashinfer` package (pip install flashinfer-python), "
            "which is not installed; use --attention-backend triton or torch_native"
        )
    if device.type != "cuda":
        raise RuntimeError(f"--attention-backend flashinfer needs a CUDA device, not {device.type}")


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    supports_cuda_graph = True

    def __init__(self, device: torch.device) -> None:
        check_flashinfer_usable(device)
        import flashinfer
        from flashinfer.cascade import merge_state

        self._flashinfer = flashinfer
        self._merge_state = merge_state
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.paged_prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._decode: dict[bool, Any] = {}
        self.device = torch.device(device)
        self.graph_buffers: FlashInferGraphBuffers | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.seq_lens.device
        if batch.mode.is_decode:
            kv_lens, qo_indptr, has_prefix = batch.seq_lens_cpu, None, True
        else:
            kv_lens, has_prefix = batch.extend_prefix_lens_cpu, any(batch.extend_prefix_lens_cpu)
            qo_indptr = _indptr(batch.extend_seq_lens_cpu, device)
        kv_indptr = _indptr(kv_lens, device)
        kv_indices = create_kv_indices(batch.req_to_token, batch.req_pool_indices, kv_indptr, sum(kv_lens))
        ones = torch.ones(batch.batch_size, dtype=torch.int32, device=device)
        batch.attn_metadata = FlashInferMetadata(qo_indptr, kv_indptr, kv_indices, ones, has_prefix)

    def forward_decode(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        meta: FlashInferMetadata = batch.attn_metadata
        wrapper = self._decode_wrapper(layer) if meta.graph_bs is None else self._graph_wrapper(meta.graph_bs, layer)
        if self._first_use(meta, layer):
            _check_supported(q.dtype, layer)
            _plan_decode(wrapper, meta, layer, q.dtype, batch.kv_pool.dtype)
            if meta.graph_bs is not None:
                self.graph_buffers.plan = (layer, q.dtype, batch.kv_pool.dtype)
        return wrapper.run(q.contiguous(), _paged_cache(batch, layer), **_kv_scales(batch, layer))

    def init_cuda_graph_state(self, batch_sizes: list[int], max_context_len: int) -> None:
        self.graph_buffers = FlashInferGraphBuffers.allocate(max(batch_sizes), max_context_len, self.device)

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = self._graph_metadata(batch)
        if self.graph_buffers.plan is not None:
            # NOTE: planning copies to the host; it must happen here, never inside the stream capture.
            self._replan(batch.attn_metadata)

    def init_forward_metadata_replay_cuda_graph(self, batch: ForwardBatch, num_real: int) -> None:
        self._replan(self._graph_metadata(batch))

    def _graph_metadata(self, batch: ForwardBatch) -> FlashInferMetadata:
        buffers, bs = self.graph_buffers, batch.batch_size
        kv_indptr = buffers.kv_indptr[: bs + 1]
        kv_indptr[1:].copy_(torch.cumsum(batch.seq_lens, 0))
        total = sum(batch.seq_lens_cpu)
        create_kv_indices(batch.req_to_token, batch.req_pool_indices, kv_indptr, total, out=buffers.kv_indices)
        return FlashInferMetadata(
            None, kv_indptr, buffers.kv_indices[:total], buffers.kv_last_page_len[:bs], True, graph_bs=bs
        )

    def _replan(self, meta: FlashInferMetadata) -> None:
        layer, q_dtype, kv_dtype = self.graph_buffers.plan
        _plan_decode(self._graph_wrapper(meta.graph_bs, layer), meta, layer, q_dtype, kv_dtype)
        self._first_use(meta, layer)

    def _graph_wrapper(self, bs: int, layer: AttentionLayer):
        buffers = self.graph_buffers
        if bs not in buffers.wrappers:
            buffers.wrappers[bs] = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=_use_tensor_cores(layer),
                paged_kv_indptr_buffer=buffers.kv_indptr[: bs + 1], paged_kv_indices_buffer=buffers.kv_indices,
                paged_kv_last_page_len_buffer=buffers.kv_last_page_len[:bs],
            )
        return buffers.wrappers[bs]

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        meta: FlashInferMetadata = batch.attn_metadata
        if self._first_use(meta, layer):
            _check_supported(q.dtype, layer)
            self._plan_extend(meta, layer, q.dtype, batch.kv_pool.dtype)
        q, k, v = q.contiguous(), k.contiguous().to(q.dtype), v.contiguous().to(q.dtype)
        if not meta.has_prefix:
            return self.ragged.run(q, k, v)
        out_new, lse_new = self.ragged.run(q, k, v, return_lse=True)
        out_prefix, lse_prefix = self.paged_prefill.run(q, _paged_cache(batch, layer), return_lse=True,
                                                        **_kv_scales(batch, layer))
        out, _ = self._merge_state(out_new, lse_new, out_prefix, lse_prefix)
        return out

    def _plan_extend(self, meta: FlashInferMetadata, layer: AttentionLayer, q_dtype, kv_dtype) -> None:
        self.ragged.plan(
            meta.qo_indptr, meta.qo_indptr, layer.num_heads, layer.num_kv_heads, layer.head_dim,
            causal=True, sm_scale=layer.scaling, q_data_type=q_dtype,
        )
        if meta.has_prefix:
            self.paged_prefill.plan(
                meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, layer.num_heads,
                layer.num_kv_heads, layer.head_dim, 1, causal=False, sm_scale=layer.scaling,
                q_data_type=q_dtype, kv_data_type=kv_dtype,
            )

    def _decode_wrapper(self, layer: AttentionLayer):
        tensor_cores = _use_tensor_cores(layer)
        if tensor_cores not in self._decode:
            self._decode[tensor_cores] = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=tensor_cores
            )
        return self._decode[tensor_cores]

    @staticmethod
    def _first_use(meta: FlashInferMetadata, layer: AttentionLayer) -> bool:
        key = (layer.num_heads, layer.head_dim, layer.scaling)
        first = key not in meta.planned
        meta.planned.add(key)
        return first


def _use_tensor_cores(layer: AttentionLayer) -> bool:
    # NOTE: FlashInfer's tensor-core decode path is the faster one once 4+ query heads share a KV head.
    return layer.num_heads // layer.num_kv_heads >= 4


def _plan_decode(wrapper, meta: FlashInferMetadata, layer: AttentionLayer, q_dtype, kv_dtype) -> None:
    wrapper.plan(
        meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, layer.num_heads, layer.num_kv_heads,
        layer.head_dim, 1, sm_scale=layer.scaling, q_data_type=q_dtype, kv_data_type=kv_dtype,
    )


def _check_supported(dtype: torch.dtype, layer: AttentionLayer) -> None:
    if dtype not in _SUPPORTED_DTYPES:
        raise RuntimeError(f"--attention-backend flashinfer supports float16/bfloat16, not {dtype}; "
                           "use --dtype bfloat16 or --attention-backend triton")
    if layer.head_dim not in _SUPPORTED_HEAD_DIMS:
        raise RuntimeError(f"--attention-backend flashinfer supports head_dim 64/128/256, not {layer.head_dim}; "
                           "use --attention-backend triton")


def _paged_cache(batch: ForwardBatch, layer: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's K/V buffers as FlashInfer NHD pages of one token: [slots, 1, kv_heads, head_dim]."""
    k_buffer = batch.kv_pool.k_buffer[layer.layer_id]
    v_buffer = batch.kv_pool.v_buffer[layer.layer_id]
    return k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)


def _kv_scales(batch: ForwardBatch, layer: AttentionLayer) -> dict[str, float]:
    """An fp8 pool's K/V scales for `run` (FlashInfer multiplies the softmax scale by k_scale and the output by
    v_scale); nothing for the default 1.0, so older FlashInfer releases work too."""
    k_scale, v_scale = batch.kv_pool.k_scales[layer.layer_id], batch.kv_pool.v_scales[layer.layer_id]
    return {} if k_scale == v_scale == 1.0 else {"k_scale": k_scale, "v_scale": v_scale}


def _indptr(lengths: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=device)
