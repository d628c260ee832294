"""Native CPU kernels, built once on first use with torch's extension builder (the machine's C++ compiler) and
cached under TORCH_EXTENSIONS_DIR (~/.cache/torch_extensions)."""
from __future__ import annotations

import functools
import logging
from importlib.resources import files

import torch

logger = logging.getLogger("runtime")
EXTENSION_NAME = "toolkit_cpu_kernels"


class NativeKernelUnavailable(RuntimeError):
    """The kernels could not be built here (no compiler, or it failed); the message says why."""


@functools.lru_cache(maxsize=1)
def load_kernels() -> None:
    """Build (or load the cached build of) the kernels, registering `torch.ops.toolkit_cpu.*`."""
    from torch.utils import cpp_extension

    source = str(files("toolkit.runtime.attention.cpu") / "paged_decode.cpp")
    try:
        cpp_extension.load(name=EXTENSION_NAME, sources=[source], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                           is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError, SystemExit) as exc:
        raise NativeKernelUnavailable(f"could not build the CPU attention kernel: {exc}") from exc


def paged_decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one new query token per request over its cached K/V, read in place from the pool.

    q: [batch, heads, dim]; k/v_buffer: [slots, kv_heads, dim]; req_to_token: [rows, max_context] slot table;
    req_pool_indices, seq_lens: [batch] int64 (each request's table row and its number of cached tokens, the new
    one included). Returns [batch, heads, dim] in q's dtype.
    """
    load_kernels()
    out = torch.empty_like(q) if out is None else out
    torch.ops.toolkit_cpu.paged_decode_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
                                                 scale, out)
    return out
