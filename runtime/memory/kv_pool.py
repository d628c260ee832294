"""The token → KV pool: per-layer K and V buffers indexed by slot."""
from __future__ import annotations

import torch


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
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        shape = (size + page_size, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def bytes_per_token(self) -> int:
        k = self.k_buffer[0]
        return 2 * len(self.k_buffer) * k.shape[1] * k.shape[2] * k.element_size()

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)
