"""Resolve `--model-path`/`--load-format` into a ModelConfig, a weight source and a tokenizer location."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from toolkit.runtime.model_loader.config import (
    ModelConfig,
    load_hf_config,
    load_preset,
    preset_names,
    with_context_length,
)
from toolkit.runtime.model_loader.embedded import embedded_model_path, resolve_model_path
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.gguf_file import iter_gguf_weights, open_gguf
from toolkit.runtime.model_loader.safetensors_files import iter_safetensors_weights, safetensors_files

WeightSource = Callable[[], Iterator[tuple[str, torch.Tensor]]]


@dataclass
class ModelSource:
    config: ModelConfig
    load_format: str  # "safetensors" | "gguf" | "dummy"
    weights: WeightSource | None  # None for dummy weights
    tokenizer_path: Path
    display_path: str


def _format_of(path: Path, load_format: str) -> str:
    if load_format != "auto":
        return load_format
    return "gguf" if path.is_file() and path.suffix == ".gguf" else "safetensors"


def _dummy_source(model_path: str | None, tokenizer_path: str | None) -> ModelSource:
    if model_path and model_path in preset_names():
        config = load_preset(model_path)
        tokenizer = Path(tokenizer_path) if tokenizer_path else embedded_model_path()
        return ModelSource(config, "dummy", None, tokenizer, model_path)
    path = resolve_model_path(model_path)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(open_gguf(path).config, "dummy", None, Path(tokenizer_path or path), str(path))
    if not path.is_dir():
        raise ModelLoadError(
            f"--load-format dummy needs a preset ({', '.join(preset_names())}), a model folder or a .gguf file; "
            f"got {model_path}"
        )
    tokenizer = Path(tokenizer_path) if tokenizer_path else path
    return ModelSource(load_hf_config(path), "dummy", None, tokenizer, str(path))


def resolve_model_source(
    model_path: str | None,
    load_format: str = "auto",
    tokenizer_path: str | None = None,
    context_length: int | None = None,
    overrides: dict | None = None,
) -> ModelSource:
    """Everything needed to build the model, without loading the weights yet."""
    if load_format == "dummy":
        source = _dummy_source(model_path, tokenizer_path)
    else:
        path = resolve_model_path(model_path)
        fmt = _format_of(path, load_format)
        if fmt == "gguf":
            if not (path.is_file() and path.suffix == ".gguf"):
                raise ModelLoadError(f"--load-format gguf needs a .gguf file; got {path}")
            gguf_model = open_gguf(path)
            source = ModelSource(
                gguf_model.config, "gguf", lambda: iter_gguf_weights(gguf_model),
                Path(tokenizer_path or path), str(path),
            )
        else:
            if not path.is_dir():
                raise ModelLoadError(f"{path}: expected a model folder with config.json and *.safetensors")
            config = load_hf_config(path)
            files = safetensors_files(path)
            source = ModelSource(
                config, "safetensors", lambda: iter_safetensors_weights(files),
                Path(tokenizer_path or path), str(path),
            )
    source.config = with_context_length(source.config.with_overrides(overrides or {}), context_length)
    return source
