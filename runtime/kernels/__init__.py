"""Native CPU kernels, built once on first use with torch's extension builder (the machine's C++ compiler) and
cached under TORCH_EXTENSIONS_DIR (~/.cache/torch_extensions) in a folder named after the CPU's kernel tier
(`cpu_capability.KERNEL_TIERS`: a build made on another CPU, in a shared home or a baked image, is never loaded
here): decode attention over the paged pool and the
store of a step's K/V rows into it (`paged_decode.cpp`), causal bf16/float32 prefill attention of new sequences
(`prefill_attention.cpp`) and the decoder layer's fused elementwise steps (`elementwise.cpp`)."""
from __future__ import annotations

import functools
import hashlib
import logging
from importlib.resources import files

import torch

from toolkit.runtime import cpu_capability

logger = logging.getLogger("runtime")
EXTENSION_PREFIX = "toolkit_cpu_kernels"
SOURCES = ("paged_decode.cpp", "elementwise.cpp", "prefill_attention.cpp")
HEADER = "cpu_math.h"  # included by every source


class NativeKernelUnavailable(RuntimeError):
    """The kernels could not be built here (no compiler, or it failed); the message says why."""


def extension_name(tier: cpu_capability.KernelTier) -> str:
    """The build's name, and so its cache folder: one per tier."""
    return f"{EXTENSION_PREFIX}_{tier.name.replace('-', '_').replace('.', '_')}"


@functools.lru_cache(maxsize=1)
def load_kernels() -> None:
    """Build (or load the cached build of) the kernels, registering `torch.ops.toolkit_cpu.*`."""
    from torch.utils import cpp_extension

    tier = cpu_capability.probe().tier
    if tier is None:
        raise NativeKernelUnavailable(f"no kernel tier is defined for this CPU ({cpu_capability.probe().arch})")
    folder = files("toolkit.runtime.kernels")
    sources = [str(folder / name) for name in SOURCES]
    # NOTE: -ffp-contract=off keeps a*b+c two roundings, as torch's own elementwise ops compute it. torch rebuilds
    # when a source or a flag changes, not a header: the header's digest rides along as a flag.
    header_digest = hashlib.sha256((folder / HEADER).read_bytes()).hexdigest()[:16]
    flags = ["-O3", *tier.cflags, "-fopenmp", "-ffp-contract=off", f"-DTOOLKIT_CPU_MATH_H={header_digest}"]
    try:
        cpp_extension.load(name=extension_name(tier), sources=sources, extra_cflags=flags, is_python_module=False,
                           verbose=False)
    except (RuntimeError, OSError, ImportError, SystemExit) as exc:
        raise NativeKernelUnavailable(f"could not build the CPU kernels: {exc}") from exc


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the kernels are built (or build now) here; logs why not, once."""
    try:
        load_kernels()
    except NativeKernelUnavailable as exc:
        logger.warning(f"{exc}; the CPU path falls back to torch ops (slower)")
        return False
    return True


def applies_to(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: on CPU with a contiguous last dim, outside torch.compile (inductor
    fuses the torch ops itself), where the kernels build."""
    return (all(t.is_cpu and t.stride(-1) == 1 for t in tensors)
            and not torch.compiler.is_compiling() and available())


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


@functools.lru_cache(maxsize=None)
def prefill_attention_supported(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether `prefill_attention` attends this dtype here: bf16 where ATen's oneDNN micro-kernels pack it (AMX),
    float32 on x86 with AVX2 or more."""
    return available() and torch.ops.toolkit_cpu.prefill_attention_supported(dtype)


def prefill_attention_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `prefill_attention` takes these: bf16 or float32 [tokens, heads, head_dim] views of one dtype whose
    heads are contiguous (the layout the QKV projection's split gives), head_dim a multiple of 16, on a CPU it
    supports for that dtype."""
    return (q.dtype in (torch.bfloat16, torch.float32)
            and all(t.dtype == q.dtype and t.dim() == 3 and t.stride(1) == t.shape[2] for t in (q, k, v))
            and q.shape[2] % 16 == 0 and applies_to(q, k, v) and prefill_attention_supported(q.dtype))


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_starts: torch.Tensor,
                      seq_lens: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """Causal attention of whole new sequences (nothing cached before them), into `out` rows in place.

    q/out: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] (GQA); seq_starts, seq_lens: [n] int64, sequence i
    being rows seq_starts[i] .. seq_starts[i] + seq_lens[i] of all four. Rows of no sequence are left untouched.
    """
    load_kernels()
    torch.ops.toolkit_cpu.prefill_attention(q, k, v, seq_starts, seq_lens, scale, out)


def store_kv_applies(k_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `store_kv` takes these: a contiguous pool, int64 slots, rows whose heads are contiguous."""
    return (k_buffer.is_contiguous() and loc.dtype == torch.int64 and loc.dim() == 1
            and all(t.dim() == 3 and t.stride(1) == t.shape[2] for t in (k, v)) and applies_to(k_buffer, loc, k, v))


def store_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k_buffer[loc] = k and v_buffer[loc] = v in one call (k, v: [rows, kv_heads, dim] of the pool's dtype)."""
    load_kernels()
    torch.ops.toolkit_cpu.store_kv(k_buffer, v_buffer, loc, k, v)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rms_norm(x) over the last dim, as `RMSNorm.forward` computes it (x: [rows, features])."""
    out = torch.empty_like(x)
    load_kernels()
    torch.ops.toolkit_cpu.rms_norm(x, weight, eps, out)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x, then x = weight * rms_norm(residual)."""
    load_kernels()
    torch.ops.toolkit_cpu.fused_add_rms_norm(x, residual, weight, eps)


def rotary_neox(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place, neox style: q, k [tokens, heads, head_dim]; cos, sin [tokens, head_dim / 2] of their dtype."""
    load_kernels()
    torch.ops.toolkit_cpu.rotary_neox(q, k, cos, sin)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] ([rows, 2 n] -> [rows, n])."""
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    load_kernels()
    torch.ops.toolkit_cpu.silu_and_mul(gate_up, out)
    return out
