"""Building blocks shared by the decoder models, sharded Megatron-style under tensor parallelism.

A linear layer holds this rank's part of the checkpoint's matrices: `rows` names, for each checkpoint matrix stacked
into its weight (q/k/v, gate/up; "" for a layer of one matrix), the slice of that matrix's rows it holds (all of
them when not column-parallel), and `columns` the slice of input features a row-parallel layer holds. The loader
(`weights.py`) reads only these; the layers never see the checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.runtime import kernels as cpu_kernels

if TYPE_CHECKING:
    from toolkit.runtime.distributed.group import TPGroup


@dataclass(frozen=True)
class Slice:
    """[start, start + size) of a checkpoint tensor along `dim`. Indices past the tensor's end (a vocabulary padded
    to a multiple of the TP size) read as zeros."""

    dim: int
    start: int
    size: int

    @classmethod
    def whole(cls, size: int) -> Slice:
        return cls(0, 0, size)

    @classmethod
    def of_rank(cls, dim: int, total: int, rank: int, ranks: int) -> Slice:
        per_rank = -(-total // ranks)
        return cls(dim, rank * per_rank, per_rank)

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() <= self.dim:
            return tensor
        end = min(self.start + self.size, tensor.shape[self.dim])
        part = tensor.narrow(self.dim, self.start, max(0, end - self.start))
        missing = self.size - part.shape[self.dim]
        if missing:
            pad_shape = list(part.shape)
            pad_shape[self.dim] = missing
            part = torch.cat([part, part.new_zeros(pad_shape)], dim=self.dim)
        return part


def fused_cpu_kernels(*tensors: torch.Tensor) -> bool:
    """Whether the native CPU kernels take these as [rows, features] (a Qwen3 q/k norm's 3-D input keeps torch)."""
    return all(t.dim() == 2 for t in tensors) and cpu_kernels.applies_to(*tensors)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu_kernels(x):
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        # NOTE: Hugging Face's order: normalize in float32, cast back, then scale (F.rms_norm fuses the first part).
        normalized = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps)
        return self.weight * normalized.to(x.dtype)

    def forward_with_residual(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the residual stream, then normalize: returns (normalized, new residual). On CPU both are written in
        place (x becomes the normalized rows, residual the sum): callers pass tensors nothing else reads."""
        if fused_cpu_kernels(x, residual):
            cpu_kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
            return x, residual
        summed = residual + x
        return self.forward(summed), summed


# Up to how many rows a packed weight beats the plain kernel. bf16/fp16: above 512 rows the plain (AMX) kernel is
# as fast or faster; float32 on an AVX2 CPU: packed 2.0x at 4 rows, 1.4x at 64, 1.2x at 256, 1.03x at 2048, and a
# batch-1 decode step 1.36x (1 row alone: 0.88x and 1.20x in two runs) (cpu_packing_float32_avx2.runs.jsonl).
PACKED_MAX_ROWS: dict[torch.dtype, float] = {torch.bfloat16: 512, torch.float16: 512, torch.float32: math.inf}


def packed_serves(rows: torch.Tensor) -> bool:
    """Whether a packed weight should multiply these rows (see PACKED_MAX_ROWS)."""
    return rows.shape[0] <= PACKED_MAX_ROWS.get(rows.dtype, 0)


class ShardedRows:
    """Where a layer's weight rows come from: `row_offsets[name]` is the first local row of checkpoint matrix
    `name`, `rows[name]` the slice of that matrix this rank holds."""

    rows: dict[str, Slice]
    row_offsets: dict[str, int]
    columns: Slice | None

    def _set_shards(self, rows: dict[str, Slice], columns: Slice | None) -> None:
        self.rows, self.columns, self.row_offsets, offset = dict(rows), columns, {}, 0
        for name, part in rows.items():
            self.row_offsets[name] = offset
            offset += part.size


class Linear(nn.Linear, ShardedRows):
    """nn.Linear that, once `pack_for_cpu` gave it a oneDNN-packed copy of its weight, uses that copy for small
    batches: bf16 AMX kernels otherwise re-lay-out the weight on every call, which doubles decode's weight
    traffic."""

    packed_weight: torch.Tensor | None = None

    def __init__(self, in_features: int, rows: dict[str, Slice], bias: bool, columns: Slice | None = None) -> None:
        super().__init__(in_features, sum(part.size for part in rows.values()), bias=bias)
        self._set_shards(rows, columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None and packed_serves(x):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def make_linear(in_features: int, rows: dict[str, Slice], bias: bool, columns: Slice | None = None,
                quantization: str | None = None) -> nn.Module:
    if quantization == "fp8":
        from toolkit.runtime.models.fp8 import Fp8Linear

        return Fp8Linear(in_features, rows, bias, columns)
    return Linear(in_features, rows, bias, columns)


class VocabEmbedding(nn.Module, ShardedRows):
    """Token embeddings. Under TP each rank holds a slice of the vocabulary's rows; a token outside it looks up
    zeros, and the ranks' lookups are summed."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup | None) -> None:
        super().__init__()
        rows = Slice.of_rank(0, vocab_size, tp.rank, tp.size) if tp is not None else Slice.whole(vocab_size)
        self._set_shards({"": rows}, None)
        self.weight = nn.Parameter(torch.empty(rows.size, hidden_size))
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.rows[""].start
        outside = (local < 0) | (local >= self.weight.shape[0])
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill_(outside[:, None], 0.0)
        return self.tp.all_reduce(hidden)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if fused_cpu_kernels(gate_up):
        return cpu_kernels.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
