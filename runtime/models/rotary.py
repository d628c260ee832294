"""Rotary position embeddings (neox style, as Hugging Face Llama/Qwen), incl. linear and llama3 scaling."""
from __future__ import annotations

import math

import torch
from torch import nn

from toolkit.runtime import kernels as cpu_kernels
from toolkit.runtime.model_loader.config import RopeConfig


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.freq_divisors is not None:
        return inv_freq / torch.tensor(rope.freq_divisors, dtype=torch.float32)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rope: RopeConfig, max_positions: int) -> None:
        super().__init__()
        self.head_dim, self.rope, self.max_positions = head_dim, rope, max_positions
        self.register_buffer("cos_cache", torch.empty(0), persistent=False)
        self.register_buffer("sin_cache", torch.empty(0), persistent=False)
        if not self.cos_cache.is_meta:
            self.build_cache(self.cos_cache.device)

    def build_cache(self, device: torch.device) -> None:
        """(Re)compute the float32 cos/sin tables on `device`, e.g. after materializing a meta model."""
        inv_freq = inverse_frequencies(self.head_dim, self.rope)
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos_cache = angles.cos().to(device)
        self.sin_cache = angles.sin().to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The first halves of the tables (both halves are equal) for a batch's positions, [tokens, 1, dim/2],
        gathered once and shared by all layers."""
        half = self.head_dim // 2
        cos = self.cos_cache[positions, :half].unsqueeze(1).to(dtype)
        return cos, self.sin_cache[positions, :half].unsqueeze(1).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # NOTE: x*cos + rotate_half(x)*sin, half by half: the same float operations, without building rotate_half(x).
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [tokens, heads, dim], k: [tokens, kv_heads, dim]. On CPU they are rotated in place (views of the layer's
    fresh qkv projection)."""
    cos, sin = cos_sin
    if cos.dtype == q.dtype and cpu_kernels.applies_to(q, k):
        cpu_kernels.rotary_neox(q, k, cos.squeeze(1), sin.squeeze(1))
        return q, k
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
