"""The token → KV pool: per-layer K and V buffers indexed by slot.

An fp8 pool (`--kv-cache-dtype fp8_e4m3|fp8_e5m2`) stores K/scale and V/scale in one byte per value, clamped to the
format's finite range (a value past it would otherwise become inf, or NaN for e4m3, and poison every softmax that
reads it); readers multiply back by the layer's scale (1.0 unless the checkpoint carries k_scale/v_scale).
"""
from __future__ import annotations

import torch

from toolkit.runtime import kernels as cpu_kernels

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the pool's dtype: fp8 pools store x / scale clamped to the format's finite range."""
    if dtype not in FP8_DTYPES:
        return x.to(dtype)
    if scale != 1.0:
        x = x / scale
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


class KVPool:
    """K/V storage for `size` tokens. Slots [0, page_size) are a reserved padding page, never handed out."""

    def __init__(
        self,
        size: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        scales: list[tuple[float, float]] | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        shape = (size + page_size, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        scales = scales or [(1.0, 1.0)] * num_layers
        self.k_scales = [k for k, _ in scales]
        self.v_scales = [v for _, v in scales]

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def bytes_per_token(self) -> int:
        k = self.k_buffer[0]
        return 2 * len(self.k_buffer) * k.shape[1] * k.shape[2] * k.element_size()

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        k_buffer, v_buffer = self.k_buffer[layer_id], self.v_buffer[layer_id]
        if k.dtype == self.dtype == v.dtype and cpu_kernels.store_kv_applies(k_buffer, loc, k, v):
            cpu_kernels.store_kv(k_buffer, v_buffer, loc, k, v)  # one native call instead of two index_put
            return
        k_buffer[loc] = quantize_kv(k, self.dtype, self.k_scales[layer_id])
        v_buffer[loc] = quantize_kv(v, self.dtype, self.v_scales[layer_id])
