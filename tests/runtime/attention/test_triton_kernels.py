"""Every Triton kernel against the torch_native backend, in Triton's interpreter on CPU (compiled on CUDA)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from toolkit.runtime.attention.torch_native import TorchNativeBackend
from toolkit.runtime.attention.triton_backend import TritonBackend
from toolkit.runtime.attention.triton_ops.decode_attention import DecodeConfig
from toolkit.runtime.attention.triton_ops.extend_attention import ExtendConfig
from toolkit.runtime.attention.triton_ops.kv_indices import create_kv_indices
from toolkit.runtime.attention.triton_ops.kv_store import store_kv
from tests.runtime.attention.cases import Case, Request, make_case

FP32_TOLERANCE = 1e-5  # observed max abs errors ~5e-7
# bf16/fp16 outputs against a float32 reference of the same inputs: within one unit in the last place
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _small_block_backend() -> TritonBackend:
    """Blocks of 16 and up to 4 KV splits of >= 16 tokens, so small interpreter shapes cross every boundary."""
    return TritonBackend(
        torch.device("cpu"), max_kv_splits=4, min_split_tokens=16,
        decode_config=DecodeConfig(block_n=16), extend_config=ExtendConfig(block_m=16, block_n=16),
    )


def _check_against_torch_native(case: Case, backend, label: str) -> None:
    out, pool = case.run(backend)
    reference_case = case.to(torch.float32, "cpu")
    reference, reference_pool = reference_case.run(TorchNativeBackend())
    err = (out.float().cpu() - reference).abs()
    print(f"{label}: max abs error {err.max().item():.2e}")
    if case.q.dtype == torch.float32:
        assert err.max().item() < FP32_TOLERANCE, label
    else:
        bound = ULP[case.q.dtype] * reference.abs() + 1e-3 * ULP[case.q.dtype]
        worst = (err - bound).max().item()
        assert worst <= 0, f"{label}: error exceeds one ulp by {worst:.2e}"
    for mine, theirs in zip(pool.k_buffer + pool.v_buffer, reference_pool.k_buffer + reference_pool.v_buffer):
        assert torch.equal(mine.float().cpu(), theirs), f"{label}: pool contents differ"


def test_store_kv_writes_strided_rows_into_their_slots_with_a_cast():
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(5, 3 * 2 * 24, generator=gen)  # k and v are strided views, as after the qkv split
    k = qkv[:, 48:96].view(5, 2, 24)
    v = qkv[:, 96:].view(5, 2, 24)
    k_buffer = torch.zeros(12, 2, 24, dtype=torch.bfloat16)
    v_buffer = torch.zeros(12, 2, 24, dtype=torch.bfloat16)
    loc = torch.tensor([7, 2, 11, 3, 8])
    store_kv(k_buffer, v_buffer, loc, k, v)
    expected_k = torch.zeros_like(k_buffer)
    expected_k[loc] = k.bfloat16()
    expected_v = torch.zeros_like(v_buffer)
    expected_v[loc] = v.bfloat16()
    assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)


def test_create_kv_indices_flattens_each_requests_slots():
    req_to_token = torch.randint(0, 1000, (6, 700), dtype=torch.int32)
    rows = torch.tensor([4, 0, 2])
    lengths = [600, 0, 9]
    indptr = torch.tensor([0, 600, 600, 609], dtype=torch.int32)
    indices = create_kv_indices(req_to_token, rows, indptr, sum(lengths))
    expected = torch.cat([req_to_token[r, :n] for r, n in zip(rows.tolist(), lengths)])
    assert torch.equal(indices, expected)


DECODE_CASES = {
    # name: (page_size, heads, kv_heads, head_dim, dtype)
    "mha-ps1-d64-fp32": (1, 4, 4, 64, torch.float32),
    "gqa4-ps16-d128-bf16": (16, 8, 2, 128, torch.bfloat16),
    "gqa3-ps4-d48-fp16": (4, 6, 2, 48, torch.float16),
    "gqa18-ps8-d16-fp32": (8, 36, 2, 16, torch.float32),  # a group wider than one 16-head block
}


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_decode_attention_matches_torch_native(name):
    page_size, heads, kv_heads, head_dim, dtype = DECODE_CASES[name]
    # ragged lengths, partial last pages, a shared prefix; 70 tokens make 3 real splits and one empty one
    requests = [Request(1, 1), Request(70, 1), Request(16, 1), Request(39, 1),
                Request(16, 1, shares_prefix_with=1)]
    case = make_case(requests, page_size, heads, kv_heads, head_dim, dtype, decode=True, seed=1)
    _check_against_torch_native(case, _small_block_backend(), f"decode {name}")


EXTEND_CASES = {
    # name: (page_size, heads, kv_heads, head_dim, dtype, requests)
    "mha-ps1-d64-fp32": (1, 4, 4, 64, torch.float32,
                         [Request(0, 5), Request(3, 9), Request(20, 1), Request(0, 40)]),
    "gqa4-ps16-d128-bf16": (16, 8, 2, 128, torch.bfloat16,
                            [Request(0, 17), Request(16, 9), Request(32, 1), Request(16, 3, shares_prefix_with=1)]),
    "gqa3-ps4-d48-fp16": (4, 6, 2, 48, torch.float16, [Request(8, 20), Request(0, 3), Request(4, 1)]),
}


@pytest.mark.parametrize("name", sorted(EXTEND_CASES))
def test_extend_attention_matches_torch_native(name):
    page_size, heads, kv_heads, head_dim, dtype, requests = EXTEND_CASES[name]
    case = make_case(requests, page_size, heads, kv_heads, head_dim, dtype, seed=2)
    _check_against_torch_native(case, _small_block_backend(), f"extend {name}")


def test_kernels_compile_to_ptx_for_sm90_within_shared_memory():
    """What the interpreter cannot check: tl.dot shapes, loop-carried types, shared memory of the real build."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "tests.runtime.attention.ptx_compile", "90", "bf16", "128"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    shared = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"sm_90 bf16 head_dim 128 shared memory bytes: {shared}")
    assert set(shared) == {"decode_stage1_gqa4", "decode_stage1_gqa24", "decode_stage2", "extend", "store_kv",
                           "kv_indices"}
    assert max(shared.values()) <= 99 * 1024  # fits every GPU from sm_80 on (sm_86/89 allow 99 KiB per block)


# ---- the same checks compiled on CUDA in bfloat16, with the production block sizes ----

GPU_REQUESTS = [Request(0, 300), Request(512, 77), Request(1024, 1), Request(64, 2048),
                Request(512, 5, shares_prefix_with=1)]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("geometry", [(32, 8, 128), (16, 2, 64), (14, 2, 64), (4, 4, 128)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_bf16_extend_matches_torch_native(geometry, page_size):
    heads, kv_heads, head_dim = geometry
    case = make_case(GPU_REQUESTS, page_size, heads, kv_heads, head_dim, torch.bfloat16, device="cuda", seed=3)
    _check_cuda_bf16(case, f"cuda extend {geometry} ps={page_size}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("geometry", [(32, 8, 128), (16, 2, 64), (14, 2, 64), (4, 4, 128), (64, 2, 128)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_bf16_decode_matches_torch_native(geometry, page_size):
    heads, kv_heads, head_dim = geometry
    requests = [Request(n, 1) for n in (1, 17, 300, 1000, 4095, 8191)] + [Request(512, 1, shares_prefix_with=3)]
    case = make_case(requests, page_size, heads, kv_heads, head_dim, torch.bfloat16, decode=True, device="cuda",
                     seed=4)
    _check_cuda_bf16(case, f"cuda decode {geometry} ps={page_size}")


def _check_cuda_bf16(case: Case, label: str) -> None:
    out, _ = case.run(TritonBackend(torch.device("cuda")))
    reference, _ = case.reference()
    err = (out.float() - reference).abs().max().item()
    print(f"{label}: max abs error {err:.2e}")
    assert err < 2e-2, label  # bf16 probabilities feed the P·V product, as in every bf16 flash kernel
