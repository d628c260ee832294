"""Attention backends chosen by name, with SGLang's `auto` rule."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from runtime.attention.base import AttentionBackend


def _torch_native() -> AttentionBackend:
    from runtime.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend()


_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {"torch_native": _torch_native}


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    _BACKENDS[name] = factory


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    if device.type != "cuda":
        return "torch_native"
    if importlib.util.find_spec("flashinfer") is not None and "flashinfer" in _BACKENDS:
        return "flashinfer"
    return "triton" if "triton" in _BACKENDS else "torch_native"


def create_backend(name: str, device: torch.device) -> AttentionBackend:
    resolved = resolve_backend_name(name, device)
    if resolved not in _BACKENDS:
        raise ValueError(f"--attention-backend {name}: unknown backend; available: {', '.join(sorted(_BACKENDS))}")
    return _BACKENDS[resolved]()
