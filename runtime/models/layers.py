"""Building blocks shared by the decoder models."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: Hugging Face's order: normalize in float32, cast back, then scale (F.rms_norm fuses the first part).
        normalized = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps)
        return self.weight * normalized.to(x.dtype)

    def forward_with_residual(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the residual stream, then normalize: returns (normalized, new residual)."""
        summed = residual + x
        return self.forward(summed), summed


PACKED_MAX_ROWS = 512  # above this many rows the plain kernel is as fast as the packed one (or faster)


class Linear(nn.Linear):
    """nn.Linear that, once `pack_for_cpu` gave it a oneDNN-packed copy of its weight, uses that copy for small
    batches: bf16 AMX kernels otherwise re-lay-out the weight on every call, which doubles decode's weight
    traffic."""

    packed_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None and x.shape[0] <= PACKED_MAX_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """A linear layer whose output rows concatenate several checkpoint matrices (qkv, gate/up)."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, size in shard_sizes.items():
            self.shard_offsets[name] = (offset, size)
            offset += size


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
