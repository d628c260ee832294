"""Compile the Triton kernels for a real NVIDIA target down to PTX, without a GPU (ptxas is not needed).

The interpreter runs kernels as numpy and checks neither tl.dot's shape rules nor loop-carried types nor shared
memory; this does. Run in a process without TRITON_INTERPRET:

    python -m tests.runtime.attention.ptx_compile 90 bf16 128    # prints {kernel: shared memory bytes}
"""
from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource, make_backend  # noqa: E402

from toolkit.runtime.attention.triton_ops import decode_attention, extend_attention, kv_indices, kv_store  # noqa: E402

_INT_POINTERS = {"KvIndptr": "*i32", "KvIndices": "*i32", "NumKvSplits": "*i32", "QoIndptr": "*i32",
                 "ReqToToken": "*i32", "ReqPoolIndices": "*i64", "Loc": "*i64", "PartialOut": "*fp32",
                 "PartialLse": "*fp32"}


def _signature(fn, dtype: str, constexprs: dict) -> dict[str, str]:
    """By this package's convention, capitalized parameters are pointers, sm_scale a float, the rest int32."""
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name[0].isupper():
            signature[name] = _INT_POINTERS.get(name, f"*{dtype}")
        else:
            signature[name] = "fp32" if name == "sm_scale" else "i32"
    return signature


def to_ptx(fn, dtype: str, constexprs: dict, arch: int, num_warps: int = 4, num_stages: int = 2) -> dict:
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    src = ASTSource(fn, _signature(fn, dtype, constexprs), constexprs)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
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


def compile_all(arch: int, dtype: str, head_dim: int) -> dict[str, int]:
    fp32 = dtype == "fp32"
    warps = 4 if head_dim <= 64 else 8
    kernels = {
        "decode_stage1_gqa4": (decode_attention._decode_stage1_kernel,
                               dict(GROUP=4, BLOCK_H=16, BLOCK_D=head_dim, BLOCK_N=64, FP32_DOT=fp32), 4, 2),
        "decode_stage1_gqa24": (decode_attention._decode_stage1_kernel,
                                dict(GROUP=24, BLOCK_H=16, BLOCK_D=head_dim, BLOCK_N=64, FP32_DOT=fp32), 4, 2),
        "decode_stage2": (decode_attention._decode_stage2_kernel, dict(BLOCK_D=head_dim, BLOCK_N=64), 4, 2),
        "extend": (extend_attention._extend_attention_kernel,
                   dict(GROUP=4, BLOCK_M=64, BLOCK_N=64, BLOCK_D=head_dim, FP32_DOT=fp32), warps, 1 if fp32 else 2),
        "store_kv": (kv_store._store_kv_kernel, dict(BLOCK_H=8, BLOCK_D=head_dim), 4, 2),
        "kv_indices": (kv_indices._create_kv_indices_kernel, dict(BLOCK=512), 4, 2),
    }
    return {name: to_ptx(fn, dtype, constexprs, arch, warps_, stages_)["shared"]
            for name, (fn, constexprs, warps_, stages_) in kernels.items()}


if __name__ == "__main__":
    arch, dtype, head_dim = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(json.dumps(compile_all(arch, dtype, head_dim)))
