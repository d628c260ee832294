"""The architecture description every model file format is reduced to."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from importlib.resources import files
from pathlib import Path
from typing import Any

from toolkit.runtime.model_loader.errors import ModelLoadError

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")
PRESETS_DIR = Path(str(files("toolkit.runtime.model_loader") / "presets"))


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # llama.cpp stores llama3 scaling as per-frequency divisors (`rope_freqs.weight`) instead of parameters.
    freq_divisors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """SGLang's `cell_size`: K and V of every layer for one token."""
        return self.num_key_value_heads * self.head_dim * self.num_hidden_layers * 2 * dtype_bytes

    def with_overrides(self, overrides: dict[str, Any]) -> ModelConfig:
        """Apply `--json-model-override-args`: config.json keys for HF folders, field names otherwise."""
        if not overrides:
            return self
        if self.extra:
            return config_from_hf_dict({**self.extra, **overrides})
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ModelLoadError(f"--json-model-override-args: unknown model config fields {', '.join(unknown)}")
        return replace(self, **overrides)


def _rope_from_hf(d: dict[str, Any]) -> RopeConfig:
    # transformers v5 writes `rope_parameters`; v4 folders have `rope_theta` and `rope_scaling`.
    params = dict(d.get("rope_parameters") or {})
    scaling = dict(d.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"unsupported rope scaling type {rope_type!r} in config.json; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_hf_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from the contents of a Hugging Face `config.json`."""
    architectures = d.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture {architecture!r} (config.json `architectures`); "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if architecture == "MistralForCausalLM" and d.get("sliding_window") not in (None, 0):
        raise ModelLoadError(
            f"MistralForCausalLM with sliding_window={d['sliding_window']} is not supported; "
            "only full-attention Mistral models are"
        )
    try:
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(d),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=architecture == "Qwen2ForCausalLM" or bool(d.get("attention_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_eos_ids(d.get("eos_token_id")),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "bfloat16"),
            extra=dict(d),
        )
    except KeyError as exc:
        raise ModelLoadError(f"config.json is missing the field {exc.args[0]!r}") from None


def load_hf_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.exists():
        raise ModelLoadError(f"{folder}: no config.json")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    return config_from_hf_dict(data)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def load_preset(name: str) -> ModelConfig:
    path = PRESETS_DIR / f"{name}.json"
    if not path.exists():
        raise ModelLoadError(f"unknown model preset {name!r}; presets: {', '.join(preset_names())}")
    return config_from_hf_dict(json.loads(path.read_text()))


def with_context_length(config: ModelConfig, context_length: int | None) -> ModelConfig:
    if context_length is None:
        return config
    return replace(config, max_position_embeddings=context_length)
