"""A `.gguf` file: architecture from its metadata, weights mapped to Hugging Face names and dequantized."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolkit.runtime.cpu_threads import one_thread
from toolkit.runtime.model_loader.config import ModelConfig, RopeConfig
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.gguf_quants import dequantize
from toolkit.runtime.model_loader.gguf_reader import ArrayInfo, GGUFFile

GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
ROPE_FREQS = "rope_freqs.weight"


@dataclass
class GGUFModel:
    path: Path
    file: GGUFFile
    gguf_arch: str
    config: ModelConfig


def open_gguf(path: Path) -> GGUFModel:
    gguf_file = GGUFFile(path)
    arch = gguf_file.field("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    return GGUFModel(path=path, file=gguf_file, gguf_arch=arch, config=_config_from_metadata(gguf_file, arch))


def _rope(gguf_file: GGUFFile, arch: str) -> RopeConfig:
    theta = float(gguf_file.field(f"{arch}.rope.freq_base", 10000.0))
    scaling = gguf_file.field(f"{arch}.rope.scaling.type")
    divisors = None
    for tensor in gguf_file.tensors:
        if tensor.name == ROPE_FREQS:
            values = dequantize(gguf_file.tensor_data(tensor), tensor.qtype, (-1,), ROPE_FREQS)
            divisors = tuple(float(x) for x in values)
    if scaling == "linear":
        factor = float(gguf_file.field(f"{arch}.rope.scaling.factor", 1.0))
        return RopeConfig(theta=theta, rope_type="linear", factor=factor, freq_divisors=divisors)
    if scaling not in (None, "none"):
        raise ModelLoadError(f"unsupported GGUF rope scaling type {scaling!r}")
    return RopeConfig(theta=theta, freq_divisors=divisors)


def _vocab_size(gguf_file: GGUFFile, arch: str) -> int:
    vocab = gguf_file.field(f"{arch}.vocab_size")
    if vocab is not None:
        return int(vocab)
    tokens = gguf_file.field("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError("GGUF metadata has neither a vocab_size nor a tokenizer vocabulary")
    return tokens.length if isinstance(tokens, ArrayInfo) else len(tokens)


def _config_from_metadata(gguf_file: GGUFFile, arch: str) -> ModelConfig:
    def need(key: str) -> Any:
        value = gguf_file.field(f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"GGUF metadata is missing {arch}.{key}")
        return value

    names = {t.name for t in gguf_file.tensors}
    num_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    eos = gguf_file.field("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=_vocab_size(gguf_file, arch),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(gguf_file.field(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=int(gguf_file.field(f"{arch}.attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope=_rope(gguf_file, arch),
        max_position_embeddings=int(need("context_length")),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm=arch == "qwen3",
        bos_token_id=gguf_file.field("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        torch_dtype="bfloat16",
    )


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor, or None for tensors the model does not load."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def _unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    # NOTE: llama.cpp's converter interleaves the rotary halves of Llama q/k rows; this restores HF's order.
    head_half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, head_half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def iter_gguf_weights(model: GGUFModel) -> Iterator[tuple[str, torch.Tensor]]:
    config = model.config
    for tensor in model.file.tensors:
        name = hf_name(tensor.name)
        if name is None:
            if tensor.name != ROPE_FREQS:
                raise ModelLoadError(f"{model.path}: unexpected tensor {tensor.name}")
            continue
        with one_thread():
            weight = dequantize(model.file.tensor_data(tensor), tensor.qtype, tensor.torch_shape, tensor.name)
            if model.gguf_arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
                weight = _unpermute_rotary(weight, heads)
        yield name, weight
