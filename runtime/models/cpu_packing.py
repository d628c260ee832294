"""oneDNN-packed copies of the linear weights for CPU decode (see `layers.Linear`)."""
from __future__ import annotations

import functools
import logging

import torch

from toolkit.runtime import cpu_capability
from toolkit.runtime.models.decoder import CausalLM
from toolkit.runtime.models.layers import Linear

logger = logging.getLogger("runtime")
# float32 too: a decode step with oneDNN's packed fp32 kernel is 1.3x (batch 64) to 1.7x (batch 16) faster than with
# MKL's on an AVX2 CPU, with the same sums (cpu_packing_float32_avx2.json)
PACKABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_PACKED_BYTES = 4 << 30  # the packed copy doubles weight memory; big models keep only the plain weights
DECODE_BATCH_HINT = 64


def weight_bytes(model: CausalLM) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def resident_weight_bytes(model: CausalLM) -> int:
    """The parameters plus the packed copies (each as big as the weight it packs)."""
    packed = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                 if isinstance(m, Linear) and m.packed_weight is not None)
    if model.packed_tied_head is not None:
        packed += model.lm_head_weight.numel() * model.lm_head_weight.element_size()
    return weight_bytes(model) + packed


def pack_for_cpu(model: CausalLM) -> bool:
    """Give every linear layer (and a tied LM head) a packed weight; returns whether it did. oneDNN packs a dtype
    only where it multiplies it natively (`cpu_capability`): elsewhere the layers run unpacked, said once."""
    dtype = model.model.embed_tokens.weight.dtype
    if dtype not in PACKABLE_DTYPES or weight_bytes(model) > MAX_PACKED_BYTES:
        return False
    if not torch.backends.mkldnn.is_available():
        logger.info("This torch has no oneDNN: linear layers run unpacked")
        return False
    capability = cpu_capability.probe()
    if not capability.native_dtype(dtype):
        _say_unpacked(dtype, capability.isa)
        return False
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Linear):
                module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight, DECODE_BATCH_HINT)
        if model.lm_head is None:
            model.packed_tied_head = torch.ops.mkldnn._reorder_linear_weight(model.lm_head_weight, DECODE_BATCH_HINT)
    logger.info("CPU decode uses oneDNN-packed linear weights")
    return True


@functools.lru_cache(maxsize=None)
def _say_unpacked(dtype: torch.dtype, isa: str) -> None:
    logger.warning(f"oneDNN has no native {str(dtype).removeprefix('torch.')} GEMM on this CPU (ISA {isa}): linear "
                   "layers run unpacked (measured 2-3x slower than --dtype float32 at batch 16-64 on an AVX2 CPU)")
