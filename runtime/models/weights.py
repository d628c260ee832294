"""Checkpoint tensors (Hugging Face names) → the model's parameters, incl. merged qkv and gate/up."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.models.decoder import CausalLM
from toolkit.runtime.models.layers import MergedLinear

# checkpoint module name → (merged module name, shard)
STACKED: dict[str, tuple[str, str]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _route(name: str) -> tuple[str, str | None]:
    """(our parameter name, shard or None) for a checkpoint name."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in STACKED:
        merged, shard = STACKED[parts[-2]]
        return ".".join([*parts[:-2], merged, parts[-1]]), shard
    return name, None


def _copy(param: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if param.shape != weight.shape:
        raise ModelLoadError(f"tensor {name} has shape {tuple(weight.shape)}, the model expects {tuple(param.shape)}")
    param.copy_(weight)


def load_weights(model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    expected = {f"{p}:{s}" if s else p for p, s in _expected_targets(model)}
    loaded: set[str] = set()
    with torch.no_grad():
        for name, weight in weights:
            if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.lm_head is None):
                continue
            target, shard = _route(name)
            if target not in params:
                raise ModelLoadError(f"checkpoint tensor {name} matches no parameter of {model.config.architecture}")
            param = params[target]
            if shard is not None:
                module = modules[target.rsplit(".", 1)[0]]
                assert isinstance(module, MergedLinear)
                start, size = module.shard_offsets[shard]
                param = param[start : start + size]
            _copy(param, weight, name)
            loaded.add(f"{target}:{shard}" if shard else target)
    missing = sorted(expected - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {', '.join(missing[:3])}")


def _expected_targets(model: nn.Module) -> list[tuple[str, str | None]]:
    targets: list[tuple[str, str | None]] = []
    modules = dict(model.named_modules())
    for name, _ in model.named_parameters():
        module = modules[name.rsplit(".", 1)[0]]
        if isinstance(module, MergedLinear):
            targets.extend((name, shard) for shard in module.shard_offsets)
        else:
            targets.append((name, None))
    return targets


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """SGLang's dummy format: every parameter uniform in [-1e-3, 1e-3], norms at 1."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
                continue
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.uniform_(-1e-3, 1e-3, generator=generators[param.device])
