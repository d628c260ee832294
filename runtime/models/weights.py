"""Checkpoint tensors (Hugging Face names) → the model's parameters: merged qkv and gate/up, this TP rank's shard
of each (`layers.ShardedRows`), fp8 weights with their scales, and the fp8 KV-cache scales."""
from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.models.decoder import CausalLM
from toolkit.runtime.models.fp8 import Fp8Linear
from toolkit.runtime.models.layers import ShardedRows, Slice

logger = logging.getLogger("runtime")

# checkpoint module name → (merged module name, part)
STACKED: dict[str, tuple[str, str]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# fp8 checkpoints' static activation scales: activations are quantized per token at run time instead.
_ACTIVATION_SCALE_SUFFIX = ".input_scale"
_KV_SCALE_NAMES = {"k_scale": ("k_scale",), "v_scale": ("v_scale",), "kv_scale": ("k_scale", "v_scale")}


def _route(name: str) -> tuple[str, str]:
    """(our parameter name, part: "" unless merged) for a checkpoint name."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in STACKED:
        merged, part = STACKED[parts[-2]]
        return ".".join([*parts[:-2], merged, parts[-1]]), part
    return name, ""


Target = tuple[str, str, str]  # (module name, parameter kind, part)


def load_weights(model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    expected = set(_expected_targets(model))
    loaded: set[Target] = set()
    skipped_activation_scales = 0
    with torch.no_grad():
        for name, weight in weights:
            if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.lm_head is None):
                continue
            if name.endswith(_ACTIVATION_SCALE_SUFFIX):
                skipped_activation_scales += 1
                continue
            owner, _, leaf = name.rpartition(".")
            if leaf in _KV_SCALE_NAMES and owner.endswith("self_attn") and owner in modules:
                for attribute in _KV_SCALE_NAMES[leaf]:
                    setattr(modules[owner], attribute, float(weight.float().reshape(-1)[0]))
                continue
            target, part = _route(name)
            if target not in params:
                raise ModelLoadError(f"checkpoint tensor {name} matches no parameter of {model.config.architecture}")
            module_name, kind = target.rsplit(".", 1)
            filled = _load(modules[module_name], kind, params[target], weight, part, name)
            loaded.update((module_name, k, part) for k in filled)
    if skipped_activation_scales:
        logger.info(f"fp8 checkpoint: {skipped_activation_scales} static activation scales (input_scale) are not "
                    "used; activations are scaled per token at run time")
    missing = sorted(_checkpoint_name(t) for t in expected - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {', '.join(missing[:3])}")


def _load(module: nn.Module, kind: str, param: torch.Tensor, weight: torch.Tensor, part: str,
          name: str) -> tuple[str, ...]:
    """Copy one checkpoint tensor into this rank's part of `param`; returns the parameter kinds it filled."""
    if not isinstance(module, ShardedRows):
        _copy(param, weight, name)
        return (kind,)
    if part not in module.rows:
        raise ModelLoadError(f"checkpoint tensor {name} matches no part of its layer")
    rows, offset = module.rows[part], module.row_offsets[part]
    if kind == "bias" and module.columns is not None:  # NOTE: a row-parallel layer adds its whole bias once
        _copy(param, weight, name)
        return (kind,)
    if kind == "weight_scale":
        _copy(param[offset : offset + rows.size], _scale_rows(weight, rows, name), name)
        return (kind,)
    whole_rows = rows.take(weight)
    weight = module.columns.take(whole_rows) if kind == "weight" and module.columns else whole_rows
    if kind == "weight" and isinstance(module, Fp8Linear):
        _check_shape(param[offset : offset + rows.size], weight, name)
        return ("weight", "weight_scale") if module.load_rows(offset, weight, whole_rows) else ("weight",)
    _copy(param[offset : offset + rows.size], weight, name)
    return (kind,)


def _scale_rows(scale: torch.Tensor, rows: Slice, name: str) -> torch.Tensor:
    """An fp8 checkpoint's weight scale as one float32 per local row: per tensor (one value) or per channel."""
    scale = scale.float()
    if scale.numel() == 1:
        return scale.reshape(1).expand(rows.size)
    if scale.dim() == 2 and scale.shape[1] != 1:
        raise ModelLoadError(f"{name} has shape {tuple(scale.shape)}: block-wise fp8 scales are not supported "
                             "(per-tensor or per-channel only)")
    return rows.take(scale.reshape(-1))


def _check_shape(param: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if param.shape != weight.shape:
        raise ModelLoadError(f"tensor {name} has shape {tuple(weight.shape)}, the model expects {tuple(param.shape)}")


def _copy(param: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    _check_shape(param, weight, name)
    param.copy_(weight)


def _expected_targets(model: nn.Module) -> list[Target]:
    targets: list[Target] = []
    for module_name, module in model.named_modules():
        parts = list(module.rows) if isinstance(module, ShardedRows) else [""]
        for kind, _ in module.named_parameters(recurse=False):
            targets.extend((module_name, kind, part) for part in parts)
    return targets


def _checkpoint_name(target: Target) -> str:
    """The checkpoint's name of one target (q_proj for the q part of qkv_proj)."""
    module_name, kind, part = target
    if part:
        original = {(merged, p): name for name, (merged, p) in STACKED.items()}
        head, _, merged = module_name.rpartition(".")
        module_name = f"{head}.{original[(merged, part)]}"
    return f"{module_name}.{kind}"


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """SGLang's dummy format: every parameter uniform in [-1e-3, 1e-3], norms at 1; fp8 weights get scales that
    make them the same magnitudes."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
                continue
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            generator = generators[param.device]
            if name.endswith("weight_scale"):
                param.fill_(1e-3 / 448)
            elif param.element_size() == 1:  # fp8: uniform over the format's range, times the scale above
                param.copy_(torch.empty(param.shape, device=param.device).uniform_(-448, 448, generator=generator))
            else:
                param.uniform_(-1e-3, 1e-3, generator=generator)
