"""Attention backends chosen by name, with SGLang's `auto` rule."""
from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Callable

import torch

from toolkit.runtime.attention.base import AttentionBackend

logger = logging.getLogger("runtime")

BackendFactory = Callable[[torch.device], AttentionBackend]


def _torch_native(device: torch.device) -> AttentionBackend:
    from toolkit.runtime.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(device)


def _triton(device: torch.device) -> AttentionBackend:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("--attention-backend triton needs the `triton` package: pip install triton")
    from toolkit.runtime.attention.triton_backend import TritonBackend

    return TritonBackend(device)


def _flashinfer(device: torch.device) -> AttentionBackend:
    from toolkit.runtime.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend(device)


_BACKENDS: dict[str, BackendFactory] = {"torch_native": _torch_native, "triton": _triton, "flashinfer": _flashinfer}


def flashinfer_available() -> bool:
    """FlashInfer can run here: it is importable, and its kernels are prebuilt (flashinfer-jit-cache) or nvcc is on
    the PATH to build them at first use (without either, `auto` would pick a backend that fails mid-request)."""
    if importlib.util.find_spec("flashinfer") is None:
        return False
    return importlib.util.find_spec("flashinfer_jit_cache") is not None or shutil.which("nvcc") is not None


def resolve_backend_name(name: str, device: torch.device) -> str:
    """`auto`: flashinfer when importable on CUDA, else triton on CUDA, torch_native elsewhere."""
    if name != "auto":
        return name
    if device.type != "cuda":
        return "torch_native"
    return "flashinfer" if flashinfer_available() else "triton"


def create_backend(name: str, device: torch.device) -> AttentionBackend:
    """`name`: a resolved backend (`resolve_backend_name`, run once when the arguments are resolved)."""
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend {name}: unknown backend; available: {', '.join(sorted(_BACKENDS))}")
    backend = _BACKENDS[name](torch.device(device))
    logger.info(f"Attention backend: {name}, device={device}")
    return backend
