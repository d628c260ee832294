"""The attention-backend interface every kernel family implements (torch_native, triton, flashinfer)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from runtime.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionLayer:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


class AttentionBackend(ABC):
    """Writes each step's new K/V into the pool and attends over every request's cached tokens."""

    name: str = "abstract"

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
