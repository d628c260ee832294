"""The Llama-family decoder: Llama 2/3.x, SmolLM2, Mistral (full attention), Qwen2/2.5 (qkv bias), Qwen3
(q/k RMSNorm). Attention goes through the batch's backend, which owns the paged KV cache."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.runtime.attention.base import AttentionLayer
from toolkit.runtime.forward_batch import ForwardBatch
from toolkit.runtime.model_loader.config import ModelConfig
from toolkit.runtime.models.layers import PACKED_MAX_ROWS, Linear, MergedLinear, RMSNorm, silu_and_mul
from toolkit.runtime.models.rotary import RotaryEmbedding, apply_rotary


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q": config.q_size, "k": config.kv_size, "v": config.kv_size},
            bias=config.attention_bias,
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.layer = AttentionLayer(
            layer_id, self.num_heads, self.num_kv_heads, self.head_dim, scaling=self.head_dim**-0.5
        )
        self._split = [config.q_size, config.kv_size, config.kv_size]

    def forward(self, cos_sin: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self._split, dim=-1)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, cos_sin)
        out = batch.attn_backend.forward(q, k, v, self.layer, batch)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, {"gate": size, "up": size}, bias=False)
        self.down_proj = Linear(size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_id)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, cos_sin: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor, residual: torch.Tensor | None,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.forward_with_residual(hidden, residual)
        hidden = self.self_attn(cos_sin, hidden, batch)
        hidden, residual = self.post_attention_layernorm.forward_with_residual(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope, max_positions)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        hidden, residual = self.embed_tokens(batch.input_ids), None
        cos_sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden, residual = layer(cos_sin, hidden, residual, batch)
        last = residual + hidden
        if batch.logits_indices is not None:
            last = last[batch.logits_indices]
        return self.norm(last)


class CausalLM(nn.Module):
    """Decoder + LM head. `forward` returns float32 logits for each request's last token only."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_positions)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, bias=False)
        self.packed_tied_head: torch.Tensor | None = None  # set by pack_for_cpu for a tied head

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        if self.packed_tied_head is not None and hidden.shape[0] <= PACKED_MAX_ROWS:
            return torch.ops.mkldnn._linear_pointwise(hidden, self.packed_tied_head, None, "none", [], "")
        return F.linear(hidden, self.lm_head_weight)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.logits(self.model(batch)).float()
