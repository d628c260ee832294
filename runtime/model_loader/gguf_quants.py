"""Dequantization of GGUF tensor data to float32, vectorized in torch."""
from __future__ import annotations

import numpy as np
import torch

from toolkit.runtime.model_loader.errors import ModelLoadError

QK = 32  # elements per block in the Q8_0/Q4_0/Q4_1 formats
_BLOCK_BYTES = {"Q8_0": 2 + QK, "Q4_0": 2 + QK // 2, "Q4_1": 4 + QK // 2}
SUPPORTED_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def _blocks(raw: np.ndarray, qtype: str) -> torch.Tensor:
    data = torch.from_numpy(np.array(raw, copy=True).reshape(-1))
    return data.view(-1, _BLOCK_BYTES[qtype])


def _f16_column(blocks: torch.Tensor, start: int) -> torch.Tensor:
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    # NOTE: the low nibbles hold elements 0..15 of a block and the high nibbles elements 16..31.
    return torch.cat([packed & 0x0F, packed >> 4], dim=1).float()


def _dequant_q8_0(raw: np.ndarray) -> torch.Tensor:
    blocks = _blocks(raw, "Q8_0")
    return _f16_column(blocks, 0) * blocks[:, 2:].contiguous().view(torch.int8).float()


def _dequant_q4_0(raw: np.ndarray) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_0")
    return _f16_column(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8.0)


def _dequant_q4_1(raw: np.ndarray) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_1")
    return _f16_column(blocks, 0) * _nibbles(blocks[:, 4:]) + _f16_column(blocks, 2)


def _dequant_float(raw: np.ndarray, qtype: str) -> torch.Tensor:
    array = np.array(raw, copy=True).view(np.uint8)
    if qtype == "BF16":
        return (torch.from_numpy(array.view(np.uint16).astype(np.int32)) << 16).view(torch.float32)
    if qtype == "F16":
        return torch.from_numpy(array.view(np.float16).astype(np.float32))
    return torch.from_numpy(array.view(np.float32))


def dequantize(raw: np.ndarray, qtype: str, shape: tuple[int, ...], tensor_name: str) -> torch.Tensor:
    """Dequantize one tensor's raw GGUF bytes to a float32 tensor of `shape` (row-major, PyTorch order)."""
    if qtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"unsupported GGUF quantization {qtype} (tensor {tensor_name}); supported: {', '.join(SUPPORTED_TYPES)}"
        )
    if qtype in ("F32", "F16", "BF16"):
        values = _dequant_float(raw, qtype)
    else:
        values = {"Q8_0": _dequant_q8_0, "Q4_0": _dequant_q4_0, "Q4_1": _dequant_q4_1}[qtype](raw)
    return values.reshape(shape)
