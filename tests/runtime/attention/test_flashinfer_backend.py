"""The FlashInfer backend's metadata and wrapper calls, checked on CPU against a stand-in written from FlashInfer's
documented plan/run semantics (tests/runtime/attention/fake_flashinfer.py); with CUDA and flashinfer installed,
the real thing against torch_native."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from toolkit.runtime.attention import flashinfer_backend
from toolkit.runtime.attention.flashinfer_backend import FlashInferBackend
from toolkit.runtime.attention.torch_native import TorchNativeBackend
from tests.runtime.attention import fake_flashinfer
from tests.runtime.attention.cases import Case, Request, make_case

BF16_TOLERANCE = 2e-2  # bf16 output rounding of values up to ~3


@pytest.fixture
def fake_backend(monkeypatch) -> FlashInferBackend:
    fake_flashinfer.install(monkeypatch)
    monkeypatch.setattr(flashinfer_backend, "check_flashinfer_usable", lambda device: None)
    return FlashInferBackend(torch.device("cpu"))


def _error(case: Case, backend) -> float:
    out, _ = case.run(backend)
    reference, _ = case.to(torch.float32).run(TorchNativeBackend())
    return (out.float().cpu() - reference.cpu()).abs().max().item()


@pytest.mark.parametrize("mode", ["prefill", "extend-on-prefix", "decode"])
def test_flashinfer_plumbing_matches_torch_native(fake_backend, mode):
    requests = {
        "prefill": [Request(0, 7), Request(0, 20)],
        "extend-on-prefix": [Request(16, 5), Request(0, 9), Request(32, 1), Request(16, 3, shares_prefix_with=0)],
        "decode": [Request(1, 1), Request(30, 1), Request(16, 1, shares_prefix_with=1)],
    }[mode]
    case = make_case(requests, 16, 8, 2, 64, torch.bfloat16, decode=mode == "decode", seed=5)
    err = _error(case, fake_backend)
    print(f"flashinfer stand-in {mode}: max abs error {err:.2e}")
    assert err < BF16_TOLERANCE


@pytest.mark.parametrize("dtype, head_dim, message", [
    (torch.float32, 64, "flashinfer supports float16/bfloat16, not torch.float32"),
    (torch.bfloat16, 32, "flashinfer supports head_dim 64/128/256, not 32"),
])
def test_flashinfer_rejects_what_its_kernels_lack_clearly(fake_backend, dtype, head_dim, message):
    case = make_case([Request(0, 3)], 1, 2, 2, head_dim, dtype)
    with pytest.raises(RuntimeError, match=message):
        case.run(fake_backend)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
                    reason="needs CUDA and flashinfer")
@pytest.mark.parametrize("decode", [False, True])
def test_cuda_flashinfer_matches_torch_native(decode):
    requests = ([Request(n, 1) for n in (1, 300, 2047)] if decode
                else [Request(0, 300), Request(512, 77), Request(64, 1), Request(512, 5, shares_prefix_with=1)])
    case = make_case(requests, 16, 32, 8, 128, torch.bfloat16, decode=decode, device="cuda", seed=6)
    err = _error(case, FlashInferBackend(torch.device("cuda")))
    print(f"cuda flashinfer decode={decode}: max abs error {err:.2e}")
    assert err < BF16_TOLERANCE
