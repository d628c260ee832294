"""The FlashInfer backend's metadata and wrapper calls, checked on CPU against a strict stand-in written from the
pinned FlashInfer's documented plan/run semantics (tests/runtime/attention/fake_flashinfer.py), whose signatures
are compared with the installed package where there is one; with CUDA and flashinfer, the real thing against
torch_native."""
from __future__ import annotations

import importlib.util
import inspect
import tomllib
from pathlib import Path

import pytest
import torch

from toolkit.runtime.attention import flashinfer_backend
from toolkit.runtime.attention.flashinfer_backend import FlashInferBackend
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
    reference, _ = case.reference()
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
@pytest.mark.skipif(fake_flashinfer.real_flashinfer_missing() is not None,
                    reason=str(fake_flashinfer.real_flashinfer_missing()))
@pytest.mark.parametrize("decode", [False, True])
def test_cuda_flashinfer_matches_torch_native(decode):
    requests = ([Request(n, 1) for n in (1, 300, 2047)] if decode
                else [Request(0, 300), Request(512, 77), Request(64, 1), Request(512, 5, shares_prefix_with=1)])
    case = make_case(requests, 16, 32, 8, 128, torch.bfloat16, decode=decode, device="cuda", seed=6)
    err = _error(case, FlashInferBackend(torch.device("cuda")))
    print(f"cuda flashinfer decode={decode}: max abs error {err:.2e}")
    assert err < BF16_TOLERANCE


# ---- the stand-in is strict, pinned, and the pinned version's twin ----
def _decode_plan_inputs(batch: int = 2, tokens: int = 5):
    indptr = torch.tensor([0, 3, tokens], dtype=torch.int32)
    return indptr, torch.arange(tokens, dtype=torch.int32), torch.ones(batch, dtype=torch.int32)


def test_stand_in_refuses_what_the_pinned_flashinfer_would(monkeypatch):
    module = fake_flashinfer.install(monkeypatch)
    workspace = torch.empty(1 << 10, dtype=torch.uint8)
    decode = module.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr, indices, last = _decode_plan_inputs()
    with pytest.raises(TypeError, match="sm_scal"):  # a misspelled argument
        decode.plan(indptr, indices, last, 4, 2, 64, 1, sm_scal=0.125)
    with pytest.raises(NotImplementedError, match="window_left=8"):  # a feature the stand-in does not model
        decode.plan(indptr, indices, last, 4, 2, 64, 1, window_left=8)
    with pytest.raises(TypeError, match="deprecated positionally"):
        decode.plan(indptr, indices, last, 4, 2, 64, 1, "NONE")
    with pytest.raises(ValueError, match="indptr must be int32"):
        decode.plan(indptr.long(), indices, last, 4, 2, 64, 1)
    decode.plan(indptr, indices, last, 4, 2, 64, 1, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    cache = torch.zeros(8, 1, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="The dtype of q torch.float16 does not match the q_data_type"):
        decode.run(torch.zeros(2, 4, 64, dtype=torch.float16), (cache, cache))
    with pytest.raises(ValueError, match="an NHD paged cache is"):
        decode.run(torch.zeros(2, 4, 64, dtype=torch.bfloat16), (cache[:, 0], cache[:, 0]))
    indices[0] = 7  # the metadata moved under a planned wrapper
    with pytest.raises(RuntimeError, match="indices changed since plan"):
        decode.run(torch.zeros(2, 4, 64, dtype=torch.bfloat16), (cache, cache))
    with pytest.raises(ValueError, match="should be a torch.Tensor in cudagraph mode"):
        module.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True)
    graph = module.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=torch.zeros(4, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(8, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="The batch size should be fixed in cudagraph mode"):
        graph.plan(indptr, indices, last, 4, 2, 64, 1)
    with pytest.raises(TypeError, match="return_lses"):
        module.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD").run(cache, cache, cache, return_lses=True)


def test_stand_in_lse_is_base_2_and_merges_as_flashinfer_does(monkeypatch):
    module = fake_flashinfer.install(monkeypatch)
    ragged = module.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 10, dtype=torch.uint8), "NHD")
    qo = torch.tensor([0, 3], dtype=torch.int32)
    ragged.plan(qo, qo, 2, 1, 64, causal=True, sm_scale=0.125, q_data_type=torch.float32)
    q, k, v = (torch.randn(3, h, 64, generator=torch.Generator().manual_seed(h)) for h in (2, 1, 1))
    _, lse2 = ragged.run(q, k, v, return_lse=True)
    _, lse_e = ragged.run(q, k, v, return_lse=True, lse_base="ln")
    torch.testing.assert_close(lse2, lse_e / torch.log(torch.tensor(2.0)))
    halves = [ragged.run(q, k[i : i + 1].expand(3, 1, 64), v[i : i + 1].expand(3, 1, 64), return_lse=True)
              for i in (0, 1)]
    merged, _ = module.cascade.merge_state(*halves[0], *halves[1])
    assert merged.shape == (3, 2, 64) and torch.isfinite(merged).all()


def test_gpu_extra_pins_the_version_the_stand_in_copies():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert f"flashinfer-python=={fake_flashinfer.VERSION}" in pyproject["project"]["optional-dependencies"]["gpu"]


def _signature(fn) -> list[tuple[str, str, str]]:
    return [(p.name, str(p.kind), repr(p.default)) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer is not installed here")
def test_stand_in_signatures_are_the_installed_flashinfers():
    import flashinfer
    from flashinfer.cascade import merge_state

    assert flashinfer.__version__ == fake_flashinfer.VERSION, "pyproject's gpu extra pins the stand-in's version"
    for ours in fake_flashinfer.WRAPPERS:
        theirs = getattr(flashinfer, ours.__name__)
        for method in ("__init__", "plan", "run") + (("_plan_impl",) if hasattr(ours, "_plan_impl") else ()):
            assert _signature(getattr(ours, method)) == _signature(getattr(theirs, method)), (ours, method)
    assert _signature(fake_flashinfer.merge_state) == _signature(merge_state)
