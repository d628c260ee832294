"""Weights from a Hugging Face folder: `*.safetensors`, single or sharded through an index."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from toolkit.runtime.model_loader.errors import ModelLoadError

INDEX_NAME = "model.safetensors.index.json"


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc})") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelLoadError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files (use --load-format dummy for random weights)")
    return files


def iter_safetensors_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own error types for truncated or corrupt files
            raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from None
