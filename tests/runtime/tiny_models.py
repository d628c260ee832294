"""Tiny random-weight Hugging Face models, saved as real checkpoint folders, for parity tests."""
from __future__ import annotations

from pathlib import Path

import torch

TINY_CONFIGS: dict[str, dict] = {
    "llama-gqa-llama3rope": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=320, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "llama-tied-linearrope": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=320, hidden_size=64,
        intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=500.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
    "qwen2-bias": dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=320, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0,
    ),
    "qwen3-qknorm": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=320, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0,
    ),
}
# NOTE: the embedded tokenizer's whole vocabulary, so grammars (compiled against that tokenizer) apply as they would
# to the embedded model; 4 heads / 2 KV heads split by 2 for TP.
TINY_CONFIGS["llama-gqa-fullvocab"] = {**TINY_CONFIGS["llama-gqa-llama3rope"], "vocab_size": 49152}


def make_tiny_model(name: str, folder: Path, seed: int = 0):
    """Build a random transformers model for TINY_CONFIGS[name], save it to `folder`, return it (float32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(TINY_CONFIGS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, initializer_range=0.1)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize_norms(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _randomize_norms(model: torch.nn.Module, seed: int) -> None:
    # NOTE: HF initializes norms (and biases) to constants; random values make the test see mistakes there too.
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = 0.2 * torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1.0 + noise)
            elif name.endswith("bias"):
                param.copy_(noise)
