"""The native prefill kernel (bf16 where oneDNN packs bf16 (AMX), float32 on x86 with AVX2) attends every new
sequence of a batch in one call and must agree with torch's SDPA per sequence (float32 reference on the same
inputs), for GQA shapes, lengths on and off its 64-row and 64-key blocks, q/k/v as the strided views the QKV split
gives, and rows outside any sequence left alone; the torch_native backend hands it the extends with nothing cached
and SDPA the rest."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.runtime.attention.cases import Request, make_case
from toolkit.runtime import kernels as cpu_kernels
from toolkit.runtime.attention.torch_native import TorchNativeBackend

# bf16 inputs, float32 reference: the kernel rounds the probabilities to bf16 for P V, as torch's flash kernel does;
# float32 keeps them, and differs from SDPA by the order of the sums only
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}
DTYPES = [
    pytest.param(torch.float32, marks=pytest.mark.skipif(not cpu_kernels.prefill_attention_supported(torch.float32),
                                                         reason="float32 prefill needs an x86 CPU with AVX2")),
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not cpu_kernels.prefill_attention_supported(torch.bfloat16),
                                                          reason="oneDNN packs no bf16 on this CPU (no AMX)")),
]


def _qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, seed: int, dtype: torch.dtype = torch.bfloat16):
    """q, k, v as views into one projection output, the way the model's QKV split hands them over."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim))


def _sdpa(q, k, v, start: int, length: int, scale: float) -> torch.Tensor:
    rows = slice(start, start + length)
    heads = [t[rows].float().transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*heads, is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 8, 64), (32, 8, 128), (16, 2, 64),
                                                      (12, 3, 32), (10, 1, 64)])
def test_every_sequence_matches_sdpa_in_one_call(heads, kv_heads, head_dim, dtype):
    lengths = [1, 7, 63, 64, 65, 130, 300]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    q, k, v = _qkv(sum(lengths), heads, kv_heads, head_dim, seed=heads, dtype=dtype)
    scale = head_dim ** -0.5
    out = torch.empty_like(q)
    cpu_kernels.prefill_attention(q, k, v, torch.tensor(starts), torch.tensor(lengths), scale, out)
    for start, length in zip(starts, lengths):
        torch.testing.assert_close(out[start : start + length].float(), _sdpa(q, k, v, start, length, scale),
                                   atol=TOLERANCE[dtype], rtol=0, msg=f"sequence of {length} tokens")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_no_listed_sequence_are_left_untouched(dtype):
    """The backend passes only the extends with nothing cached; the other rows are SDPA's to write (an empty
    sequence writes none)."""
    q, k, v = _qkv(200, 9, 3, 64, seed=1, dtype=dtype)
    out = torch.full_like(q, 7.0)
    cpu_kernels.prefill_attention(q, k, v, torch.tensor([150, 10, 60]), torch.tensor([50, 40, 0]), 0.125, out)
    for start, length in ((150, 50), (10, 40)):
        torch.testing.assert_close(out[start : start + length].float(), _sdpa(q, k, v, start, length, 0.125),
                                   atol=TOLERANCE[dtype], rtol=0)
    untouched = torch.ones(200, dtype=torch.bool)
    untouched[10:50] = untouched[150:200] = False
    assert bool((out[untouched] == 7.0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_refuses_what_it_cannot_attend_with_a_clear_error(dtype):
    q, k, v = _qkv(20, 9, 3, 64, seed=2, dtype=dtype)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="not within the 20 tokens"):
        cpu_kernels.prefill_attention(q, k, v, torch.tensor([10]), torch.tensor([11]), 0.125, out)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        cpu_kernels.prefill_attention(q.half(), k.half(), v.half(), torch.tensor([0]), torch.tensor([20]), 0.125,
                                      out.half())
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(RuntimeError, match="all of one dtype"):
        cpu_kernels.prefill_attention(q, k.to(other), v, torch.tensor([0]), torch.tensor([20]), 0.125, out)
    assert not cpu_kernels.prefill_attention_applies(q.half(), k.half(), v.half())
    assert not cpu_kernels.prefill_attention_applies(q, k.to(other), v)
    assert not cpu_kernels.prefill_attention_applies(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    assert cpu_kernels.prefill_attention_applies(q, k, v)


MIXED_REQUESTS = [Request(0, 24), Request(37, 1), Request(32, 9), Request(0, 70), Request(128, 1), Request(0, 1),
                  Request(64, 64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_backend_attends_the_uncached_extends_in_one_kernel_call(page_size, dtype, monkeypatch):
    """A prefill batch of new sequences beside extends on a cached prefix (one-token and longer): the new
    sequences go to the prefill kernel in one call, the rest as before; together they equal SDPA for all."""
    case = make_case(MIXED_REQUESTS, page_size, 9, 3, 64, dtype, seed=page_size)
    calls = []
    kernel = cpu_kernels.prefill_attention
    monkeypatch.setattr(cpu_kernels, "prefill_attention",
                        lambda q, k, v, starts, lengths, *rest: calls.append(lengths.tolist())
                        or kernel(q, k, v, starts, lengths, *rest))
    ours, _ = case.run(TorchNativeBackend("cpu"))
    assert calls == [[24, 70, 1]]
    reference, _ = case.to(torch.float32).run(TorchNativeBackend("cpu", in_place_decode=False))
    torch.testing.assert_close(ours.float(), reference, atol=TOLERANCE[dtype], rtol=0)
