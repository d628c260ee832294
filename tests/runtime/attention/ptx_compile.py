"""Compile the Triton kernels for a real NVIDIA target down to PTX, without a GPU (ptxas is not needed).

The interpreter runs kernels as numpy and checks neither tl.dot's shape rules nor loop-carried types nor shared
memory; this does. It copies no launch configuration: it calls the package's own launch functions (with the
TritonBackend's default configs) on small CPU tensors, records each kernel launch instead of running it (its
arguments, constexprs, num_warps and num_stages, Triton's defaults where the launch sets none), and compiles
exactly that. Run in a process without TRITON_INTERPRET:

    python -m tests.runtime.attention.ptx_compile 90 bf16 128    # prints {kernel: shared memory bytes}
"""
from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from toolkit.runtime.attention.triton_backend import TritonBackend  # noqa: E402
from toolkit.runtime.attention.triton_ops import decode_attention, extend_attention, kv_indices, kv_store  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_POINTERS = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
             torch.int64: "*i64", torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}
_OPTIONS = ("num_warps", "num_stages")


@dataclass
class Launch:
    fn: JITFunction
    args: dict  # parameter name -> value, as the launch passed it
    options: dict  # num_warps / num_stages the launch set


def record_launches(call) -> list[Launch]:
    """The kernel launches `call()` makes, recorded instead of run."""
    launches: list[Launch] = []
    run = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        launches.append(Launch(self, dict(bound.arguments), options))

    JITFunction.run = record
    try:
        call()
    finally:
        JITFunction.run = run
    return launches


def _signature(launch: Launch) -> tuple[dict[str, str], dict]:
    signature, constexprs = {}, {}
    for name, value in launch.args.items():
        if name in {p.name for p in launch.fn.params if p.is_constexpr}:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _POINTERS[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature, constexprs


def to_ptx(launch: Launch, arch: int) -> dict:
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    signature, constexprs = _signature(launch)
    src = ASTSource(launch.fn, signature, constexprs)
    options = backend.parse_options(launch.options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    metadata: dict = {}
    for ext in ("ttir", "ttgir", "llir", "ptx"):
        module = stages[ext](module, metadata)
    return metadata


def _backend_default(name: str):
    return inspect.signature(TritonBackend.__init__).parameters[name].default


def production_launches(dtype: torch.dtype, head_dim: int) -> dict[str, Launch]:
    """One decode (GQA groups of 4 and of 24), extend, KV store and KV index launch, as the backend makes them."""
    batch, kv_heads, tokens, splits = 2, 2, 300, 4
    req_to_token = torch.zeros(batch, 512, dtype=torch.int32)
    kv_indptr = torch.tensor([0, 100, tokens], dtype=torch.int32)
    indices = torch.zeros(tokens, dtype=torch.int32)
    pool = torch.zeros(tokens, kv_heads, head_dim, dtype=dtype)

    def decode(group: int) -> Launch:
        heads = kv_heads * group
        q = torch.zeros(batch, heads, head_dim, dtype=dtype)
        partial_out = torch.zeros(batch, heads, splits, head_dim, dtype=torch.float32)
        partial_lse = torch.zeros(batch, heads, splits, dtype=torch.float32)
        return record_launches(lambda: decode_attention.decode_attention(
            q, pool, pool, torch.empty_like(q), kv_indptr, indices, torch.full((batch,), splits, dtype=torch.int32),
            partial_out, partial_lse, head_dim**-0.5, _backend_default("decode_config")))

    stage1_gqa4, stage2 = decode(4)
    stage1_gqa24, _ = decode(24)
    q = torch.zeros(tokens, kv_heads * 4, head_dim, dtype=dtype)
    (extend,) = record_launches(lambda: extend_attention.extend_attention(
        q, pool, pool, torch.empty_like(q), kv_indptr, kv_indptr, indices, 200, head_dim**-0.5,
        _backend_default("extend_config")))
    new = torch.zeros(tokens, kv_heads, head_dim, dtype=dtype)
    (store,) = record_launches(lambda: kv_store.store_kv(pool, pool, torch.arange(tokens), new, new))
    (index,) = record_launches(lambda: kv_indices.create_kv_indices(
        req_to_token, torch.arange(batch), kv_indptr, tokens))
    return {"decode_stage1_gqa4": stage1_gqa4, "decode_stage1_gqa24": stage1_gqa24, "decode_stage2": stage2,
            "extend": extend, "store_kv": store, "kv_indices": index}


def compile_all(arch: int, dtype: str, head_dim: int) -> dict[str, int]:
    launches = production_launches(DTYPES[dtype], head_dim)
    return {name: to_ptx(launch, arch)["shared"] for name, launch in launches.items()}


if __name__ == "__main__":
    arch, dtype, head_dim = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(json.dumps(compile_all(arch, dtype, head_dim)))
