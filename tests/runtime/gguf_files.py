"""Write GGUF files the way llama.cpp's converter does, from a tiny transformers Llama, for loader tests."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import torch

_LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_PARTS[module]}.{kind}"


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `permute` for Llama q/k rows (interleaves the rotary halves)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def _llama3_rope_factors(config) -> np.ndarray:
    scaling = config.rope_parameters if hasattr(config, "rope_parameters") else config.rope_scaling
    base = scaling.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    dim = config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_llama_gguf(model, path: Path, qtype: str = "F32", override_qtype: dict[str, str] | None = None) -> Path:
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    writer.add_rope_freq_base(float(scaling.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_vocab_size(config.vocab_size)
    if scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_rope_factors(config))
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().to(torch.float32).numpy()
        if name.endswith("q_proj.weight"):
            data = _permute(data, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, config.num_key_value_heads)
        gguf_name = _gguf_name(name)
        tensor_qtype = (override_qtype or {}).get(gguf_name, qtype if data.ndim == 2 else "F32")
        kind = gguf.GGMLQuantizationType[tensor_qtype]
        packed = data if tensor_qtype == "F32" else gguf.quants.quantize(data, kind)
        writer.add_tensor(gguf_name, packed, raw_dtype=None if tensor_qtype == "F32" else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
