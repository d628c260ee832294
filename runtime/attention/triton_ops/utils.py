"""Launch helpers shared by the kernel families."""
from __future__ import annotations

import torch
import triton


@triton.jit
def _probe() -> None:
    pass


# NOTE: Triton decides at decoration time (module import) whether kernels run in its interpreter, from
# TRITON_INTERPRET; this records what happened to the kernels in this package.
KERNELS_INTERPRETED: bool = type(_probe).__name__ == "InterpretedFunction"


def exact_fp32_dot(dtype: torch.dtype) -> bool:
    """Whether kernels should upcast tl.dot operands to float32 and multiply in IEEE precision.

    float32 data must not silently drop to TF32 on the GPU; the interpreter's tl.dot is wrong for bfloat16
    operands (it multiplies the raw bits), so there it always multiplies in float32.
    """
    return dtype == torch.float32 or KERNELS_INTERPRETED


def block_size(n: int, minimum: int = 16) -> int:
    return max(triton.next_power_of_2(n), minimum)
