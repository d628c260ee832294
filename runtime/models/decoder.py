"""The Llama-family decoder: Llama 2/3.x, SmolLM2, Mistral (full attention), Qwen2/2.5 (qkv bias), Qwen3
(q/k RMSNorm). Attention goes through the batch's backend, which owns the paged KV cache.

Under tensor parallelism (Megatron): q/k/v and gate/up are column-parallel (each rank holds its heads and its slice
of the intermediate size), o_proj and down_proj row-parallel and followed by an all-reduce, the embedding and the
LM head vocabulary-parallel (the logits are all-gathered). KV heads fewer than the ranks are replicated, as SGLang
does (`tp_shard.py` checks the sizes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.runtime.attention.base import AttentionLayer
from toolkit.runtime.forward_batch import ForwardBatch
from toolkit.runtime.model_loader.config import ModelConfig
from toolkit.runtime.models.layers import (
    Linear,
    RMSNorm,
    Slice,
    VocabEmbedding,
    make_linear,
    packed_serves,
    silu_and_mul,
)
from toolkit.runtime.models.rotary import RotaryEmbedding, apply_rotary
from toolkit.runtime.models.tp_shard import AttentionShard, tp_coordinates

if TYPE_CHECKING:
    from toolkit.runtime.distributed.group import TPGroup


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: TPGroup | None = None,
                 quantization: str | None = None) -> None:
        super().__init__()
        shard = AttentionShard.of(config, *tp_coordinates(tp))
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, config.head_dim
        q_rows = Slice(0, shard.first_head * self.head_dim, shard.num_heads * self.head_dim)
        kv_rows = Slice(0, shard.first_kv_head * self.head_dim, shard.num_kv_heads * self.head_dim)
        self.qkv_proj = make_linear(config.hidden_size, {"q": q_rows, "k": kv_rows, "v": kv_rows},
                                    config.attention_bias, quantization=quantization)
        q_columns = Slice(1, q_rows.start, q_rows.size) if tp is not None else None
        self.o_proj = make_linear(q_rows.size, {"": Slice.whole(config.hidden_size)}, False, q_columns, quantization)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.layer = AttentionLayer(
            layer_id, self.num_heads, self.num_kv_heads, self.head_dim, scaling=self.head_dim**-0.5
        )
        self._split = [q_rows.size, kv_rows.size, kv_rows.size]
        self.tp = tp
        # The checkpoint's fp8 KV-cache scales (k_scale/v_scale), read only when the KV cache is fp8.
        self.k_scale = self.v_scale = 1.0

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
        out = self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))
        return out if self.tp is None else self.tp.all_reduce(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup | None = None, quantization: str | None = None) -> None:
        super().__init__()
        rank, ranks = tp_coordinates(tp)
        rows = Slice.of_rank(0, config.intermediate_size, rank, ranks)
        self.gate_up_proj = make_linear(config.hidden_size, {"gate": rows, "up": rows}, False,
                                        quantization=quantization)
        columns = Slice(1, rows.start, rows.size) if tp is not None else None
        self.down_proj = make_linear(rows.size, {"": Slice.whole(config.hidden_size)}, False, columns, quantization)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(silu_and_mul(self.gate_up_proj(x)))
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: TPGroup | None = None,
                 quantization: str | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_id, tp, quantization)
        self.mlp = MLP(config, tp, quantization)
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
    def __init__(self, config: ModelConfig, max_positions: int, tp: TPGroup | None = None,
                 quantization: str | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp, quantization) for i in range(config.num_hidden_layers))
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
    """Decoder + LM head. `forward` returns float32 logits for each request's last token only. `quantization`
    "fp8" makes the decoder layers' linear weights fp8 (the embedding and the LM head stay in the model dtype)."""

    def __init__(self, config: ModelConfig, max_positions: int, tp: TPGroup | None = None,
                 quantization: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.model = DecoderModel(config, max_positions, tp, quantization)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, dict(self.model.embed_tokens.rows), bias=False)
        self.packed_tied_head: torch.Tensor | None = None  # set by pack_for_cpu for a tied head

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self.packed_tied_head is not None and packed_serves(hidden):
            logits = torch.ops.mkldnn._linear_pointwise(hidden, self.packed_tied_head, None, "none", [], "")
        else:
            logits = F.linear(hidden, self.lm_head_weight)
        if self.tp is None:
            return logits
        return self.tp.all_gather(logits)[:, : self.config.vocab_size]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits in the model's dtype: the sampler widens to float32 only the rows that compute with them
        (greedy rows take the argmax as they are: widening is exact, so it picks the same token)."""
        return self.logits(self.model(batch))
