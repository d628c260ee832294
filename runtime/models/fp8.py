"""fp8 weights (`--quantization fp8`, or an fp8 checkpoint): float8 e4m3 linear weights with one float32 scale per
output channel, as SGLang's `Fp8LinearMethod` with per-channel scales.

A 16/32-bit checkpoint is quantized row by row as it loads (scale = the row's absolute maximum / 448); an fp8
checkpoint (`quantization_config.quant_method: fp8`, float8 weights and `weight_scale`, per tensor or per channel)
is copied as it is. The GEMM: on a CUDA GPU with fp8 tensor cores (sm89+) activations are quantized per token and
`torch._scaled_mm` multiplies in fp8; elsewhere (CPU, older GPUs) each GEMM dequantizes the weight first, so
memory at rest is halved but compute is not faster.
"""
from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.runtime.models.layers import ShardedRows, Slice

logger = logging.getLogger("runtime")

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
MIN_SCALE = 1e-12


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """One float32 scale per row: its absolute maximum maps to the largest finite e4m3 value."""
    return (weight.float().abs().amax(dim=-1) / FP8_MAX).clamp_(min=MIN_SCALE)


def quantize_rows(weight: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, float32 per-row scales) with weight ≈ fp8 * scale[:, None]; `scale` defaults to the rows'."""
    scale = row_scales(weight) if scale is None else scale
    return (weight.float() / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


@functools.lru_cache(maxsize=None)
def scaled_mm_supported(device: torch.device) -> bool:
    """fp8 GEMMs with per-token and per-channel scales: sm90+ (Hopper) for row-wise `torch._scaled_mm`."""
    return device.type == "cuda" and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device) >= (9, 0)


class Fp8Linear(nn.Module, ShardedRows):
    """y = x (W_fp8 · diag(scale))^T + b for this rank's shard (see `layers.ShardedRows`)."""

    def __init__(self, in_features: int, rows: dict[str, Slice], bias: bool, columns: Slice | None = None) -> None:
        super().__init__()
        self._set_shards(rows, columns)
        out_features = sum(part.size for part in rows.values())
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @torch.no_grad()
    def load_rows(self, offset: int, weight: torch.Tensor, whole_rows: torch.Tensor | None = None) -> bool:
        """Write checkpoint rows at `offset`: quantized here when 16/32-bit (True: their scales are set too),
        copied when already float8 (False: the checkpoint's `weight_scale` follows). `whole_rows`: the same rows
        with every column, for a row-parallel shard: its scales are the whole rows', so every TP size quantizes
        the model alike."""
        rows = slice(offset, offset + weight.shape[0])
        if weight.dtype == FP8:
            self.weight[rows] = weight
            return False
        if weight.element_size() == 1:
            raise ValueError(f"fp8 weights must be float8_e4m3fn, not {weight.dtype}")
        scale = row_scales(weight if whole_rows is None else whole_rows).to(self.weight_scale.device)
        quantized, _ = quantize_rows(weight.to(self.weight_scale.device), scale)
        self.weight[rows], self.weight_scale[rows] = quantized, scale
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: row-wise scaled GEMMs take bfloat16 outputs and dims that are multiples of 16.
        if x.dtype == torch.bfloat16 and scaled_mm_supported(x.device) and not (self.in_features % 16 or
                                                                                self.out_features % 16):
            return _scaled_mm_linear(x, self.weight, self.weight_scale, self.bias)
        weight = (self.weight.to(torch.float32) * self.weight_scale[:, None]).to(x.dtype)
        return F.linear(x, weight, self.bias)


def _scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    """Per-token dynamic activation scales × per-channel weight scales, in fp8 tensor cores."""
    rows = x.reshape(-1, x.shape[-1])
    x_scale = (rows.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp_(min=MIN_SCALE)
    x_fp8 = (rows / x_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    out = torch._scaled_mm(x_fp8, weight.t(), scale_a=x_scale, scale_b=scale[None, :], bias=bias,
                           out_dtype=x.dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def describe_gemm(device: torch.device) -> str:
    if scaled_mm_supported(device):
        return "fp8 GEMMs (torch._scaled_mm, per-token x per-channel scales)"
    return f"fp8 weights dequantized per GEMM (no fp8 GEMM on {device.type})"
