"""An fp8 KV pool read by every attention backend: each writes K/scale and V/scale clamped to the format's finite
range, and reads them back times the layer's scales. Checked against torch_native over the same values dequantized
into a float32 pool (Triton in its interpreter on CPU)."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from toolkit.runtime.attention.torch_native import TorchNativeBackend
from toolkit.runtime.attention.triton_backend import TritonBackend
from toolkit.runtime.attention.triton_ops.decode_attention import DecodeConfig
from toolkit.runtime.attention.triton_ops.extend_attention import ExtendConfig
from toolkit.runtime.memory.kv_pool import KVPool, quantize_kv
from tests.runtime.attention.cases import Case, Request, make_case

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
K_SCALE, V_SCALE = 0.5, 2.0
DECODE = [Request(13, 1), Request(40, 1), Request(7, 1)]
EXTEND = [Request(12, 5), Request(8, 9), Request(4, 1, shares_prefix_with=0)]


def _backend(name: str):
    if name == "triton":
        return TritonBackend(torch.device("cpu"), max_kv_splits=4, min_split_tokens=16,
                             decode_config=DecodeConfig(block_n=16), extend_config=ExtendConfig(block_m=16, block_n=16))
    return TorchNativeBackend("cpu", in_place_decode=False if name == "torch_native_gather" else None)


def _fp8_case(case: Case, dtype: torch.dtype) -> Case:
    pool = copy.deepcopy(case.pool)
    pool.dtype, pool.k_scales, pool.v_scales = dtype, [K_SCALE], [V_SCALE]
    pool.k_buffer = [quantize_kv(b, dtype, K_SCALE) for b in case.pool.k_buffer]
    pool.v_buffer = [quantize_kv(b, dtype, V_SCALE) for b in case.pool.v_buffer]
    return dataclasses.replace(case, pool=pool)


def _dequantized(case: Case, fp8: Case) -> Case:
    """The float32 case holding exactly the values the fp8 pool holds (new K/V as they will be stored)."""
    dtype = fp8.pool.dtype
    pool = copy.deepcopy(case.pool)
    pool.k_buffer = [b.float() * K_SCALE for b in fp8.pool.k_buffer]
    pool.v_buffer = [b.float() * V_SCALE for b in fp8.pool.v_buffer]
    k = quantize_kv(case.k, dtype, K_SCALE).float() * K_SCALE
    v = quantize_kv(case.v, dtype, V_SCALE).float() * V_SCALE
    return dataclasses.replace(case, pool=pool, k=k, v=v)


@pytest.mark.parametrize("kv_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("requests, decode", [(DECODE, True), (EXTEND, False)], ids=["decode", "extend"])
@pytest.mark.parametrize("backend", ["torch_native", "torch_native_gather", "triton"])
def test_backends_read_a_scaled_fp8_pool(kv_dtype, requests, decode, backend):
    case = make_case(requests, page_size=4, num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.float32,
                     decode=decode, seed=3)
    fp8 = _fp8_case(case, kv_dtype)
    out, pool = fp8.run(_backend(backend))
    reference, reference_pool = _dequantized(case, fp8).run(TorchNativeBackend("cpu"))
    assert pool.k_buffer[0].dtype == kv_dtype
    assert torch.equal(pool.k_buffer[0].float() * K_SCALE, reference_pool.k_buffer[0])
    assert torch.equal(pool.v_buffer[0].float() * V_SCALE, reference_pool.v_buffer[0])
    assert (out.float() - reference).abs().max().item() < 1e-4


@pytest.mark.parametrize("kv_dtype", FP8, ids=["e4m3", "e5m2"])
def test_writes_past_the_format_clamp_instead_of_inf_or_nan(kv_dtype):
    limit = torch.finfo(kv_dtype).max
    pool = KVPool(8, 1, 1, 1, 4, kv_dtype, "cpu")
    huge = torch.tensor([[[1e9, -1e9, 3e5, 1.0]]])
    pool.set_kv(0, torch.tensor([2]), huge, huge)
    stored = pool.k_buffer[0][2].float()
    assert torch.isfinite(stored).all()
    assert stored.flatten().tolist() == [limit, -limit, limit, 1.0]
    case = make_case(DECODE, page_size=1, num_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32, decode=True)
    fp8 = _fp8_case(dataclasses.replace(case, k=case.k * 1e7, v=case.v * 1e7), kv_dtype)
    for backend in ("torch_native", "torch_native_gather", "triton"):
        out, _ = fp8.run(_backend(backend))
        assert torch.isfinite(out).all(), backend


@pytest.mark.parametrize("requests, decode", [(DECODE, True), ([Request(16, 5), Request(32, 3)], False)],
                         ids=["decode", "extend"])
def test_flashinfer_plans_the_fp8_pool_dtype_and_passes_its_scales(monkeypatch, requests, decode):
    """Against the documented-semantics stand-in (no evidence about the real kernels; those run on CUDA only)."""
    from toolkit.runtime.attention import flashinfer_backend
    from tests.runtime.attention import fake_flashinfer

    fake_flashinfer.install(monkeypatch)
    monkeypatch.setattr(flashinfer_backend, "check_flashinfer_usable", lambda device: None)
    backend = flashinfer_backend.FlashInferBackend(torch.device("cpu"))
    case = make_case(requests, 16, 8, 2, 64, torch.bfloat16, decode=decode, seed=5)
    fp8 = _fp8_case(case, torch.float8_e4m3fn)
    out, _ = fp8.run(backend)
    expected = _dequantized(case.to(torch.float32), fp8)
    if not decode:  # NOTE: FlashInfer attends the new tokens as computed (ragged), only the prefix from the pool
        expected = dataclasses.replace(expected, k=case.k.float(), v=case.v.float())
    reference, _ = expected.run(TorchNativeBackend("cpu"))
    assert backend.paged_prefill.plan_args is None or backend.paged_prefill.plan_args["kv_dtype"] == torch.float8_e4m3fn
    assert (out.float() - reference).abs().max().item() < 3e-2
