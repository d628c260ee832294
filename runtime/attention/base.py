"""The attention-backend interface every kernel family implements (torch_native, triton, flashinfer)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from toolkit.runtime.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionLayer:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


class AttentionBackend(ABC):
    """Writes each step's new K/V into the pool and attends over every request's cached tokens.

    Backends that can run inside decode CUDA graphs set `supports_cuda_graph` and implement the three graph hooks:
    persistent metadata buffers of fixed capacity, metadata over them for a capture, and an in-place refresh of
    that metadata before each replay (run eagerly, outside the graph).
    """

    name: str = "abstract"
    supports_cuda_graph: bool = False
    # NOTE: the dummy requests padding a captured batch attend to one token: their own, in the padding slot 0.
    cuda_graph_seq_len_fill_value: int = 1

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Build per-batch metadata once, before the layers run (stored on `batch.attn_metadata`)."""

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, batch: ForwardBatch
    ) -> torch.Tensor:
        """q: [tokens, heads, dim], k/v: [tokens, kv_heads, dim] for the new tokens → [tokens, heads, dim]."""

    @abstractmethod
    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, batch: ForwardBatch
    ) -> torch.Tensor:
        """One new token per request: q: [batch, heads, dim] → [batch, heads, dim]."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, batch: ForwardBatch
    ) -> torch.Tensor:
        if batch.mode.is_decode:
            return self.forward_decode(q, k, v, layer, batch)
        return self.forward_extend(q, k, v, layer, batch)

    def init_cuda_graph_state(self, batch_sizes: list[int], max_context_len: int) -> None:
        """Allocate persistent metadata buffers for decode graphs of `batch_sizes` (sorted), once, before capture."""
        raise NotImplementedError(self._no_graphs())

    def init_forward_metadata_capture_cuda_graph(self, batch: ForwardBatch) -> None:
        """Metadata over the persistent buffers for a decode batch whose tensors are the graph's input buffers."""
        raise NotImplementedError(self._no_graphs())

    def init_forward_metadata_replay_cuda_graph(self, batch: ForwardBatch, num_real: int) -> None:
        """Refresh the persistent metadata in place for a padded batch (its first `num_real` requests are real)."""
        raise NotImplementedError(self._no_graphs())

    def _no_graphs(self) -> str:
        return (f"--attention-backend {self.name} does not support CUDA graphs; use --attention-backend triton or "
                "flashinfer, or --disable-cuda-graph")
