"""The native CPU decode kernel reads K/V in place from the pool and must agree with gathering the same slots
into a dense tensor for torch's SDPA (float32 reference), for every shape family the vector path specializes
(head_dim 64/128, 1-8 query heads per K/V head), the portable path (other shapes), every pool dtype, page sizes,
shared prefixes and int32/int64 tables."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.attention.cases import Request, make_case
from toolkit.runtime import kernels as cpu_kernels
from toolkit.runtime.attention.torch_native import TorchNativeBackend

REQUESTS = [Request(37, 1), Request(0, 1), Request(128, 1), Request(5, 1), Request(300, 1),
            Request(128, 1, shares_prefix_with=2)]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _reference(case):
    """The gather + SDPA path in float32 on the same batch."""
    return case.to(torch.float32).run(TorchNativeBackend("cpu", in_place_decode=False))[0]


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 8, 64), (32, 8, 128), (28, 4, 128),
                                                      (16, 2, 64), (6, 6, 48), (18, 2, 32), (10, 1, 64)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_in_place_decode_matches_gathered_sdpa(heads, kv_heads, head_dim, page_size):
    case = make_case(REQUESTS, page_size, heads, kv_heads, head_dim, torch.float32, decode=True, seed=heads)
    ours, pool = case.run(TorchNativeBackend("cpu"))
    torch.testing.assert_close(ours, _reference(case), atol=TOLERANCE[torch.float32], rtol=0)
    # the step's own K/V went into the pool before attending
    assert torch.equal(pool.k_buffer[0][case.out_cache_loc], case.k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (32, 8, 128), (16, 2, 64), (10, 1, 64), (8, 8, 64),
                                                      (6, 6, 48)])
def test_in_place_decode_reads_half_precision_pools(dtype, heads, kv_heads, head_dim):
    """bf16 x bf16 takes the AVX512-BF16 dot products where the CPU has them (16 keys per add tree: the request
    lengths 1, 5, 37, 128 and 300 cover whole blocks and every tail)."""
    case = make_case(REQUESTS, 1, heads, kv_heads, head_dim, dtype, decode=True, seed=3)
    ours, _ = case.run(TorchNativeBackend("cpu"))
    assert ours.dtype == dtype
    torch.testing.assert_close(ours.float(), _reference(case), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_in_place_decode_widens_float8_pools(kv_dtype):
    """K/V stored in float8 are read as the float8 values they hold (the reference attends over the same
    rounded values in float32)."""
    case = make_case(REQUESTS, 1, 9, 3, 64, torch.float32, decode=True, seed=5)
    rounded = case.to(kv_dtype).to(torch.float32)
    rounded = rounded.__class__(**{**rounded.__dict__, "q": case.q, "k": case.k.to(kv_dtype).float(),
                                   "v": case.v.to(kv_dtype).float()})
    stored = case.to(kv_dtype)
    stored = stored.__class__(**{**stored.__dict__, "q": case.q, "k": case.k, "v": case.v})
    ours, pool = stored.run(TorchNativeBackend("cpu"))
    assert pool.k_buffer[0].dtype == kv_dtype
    torch.testing.assert_close(ours, _reference(rounded), atol=1e-4, rtol=0)


def test_in_place_decode_takes_an_int64_table():
    case = make_case(REQUESTS, 1, 9, 3, 64, torch.float32, decode=True, seed=7)
    wide = case.__class__(**{**case.__dict__, "req_to_token": case.req_to_token.to(torch.int64)})
    torch.testing.assert_close(wide.run(TorchNativeBackend("cpu"))[0], _reference(case), atol=2e-5, rtol=0)


def test_the_kernel_refuses_mismatched_shapes_with_a_clear_error():
    q = torch.randn(2, 9, 64)
    pool = torch.randn(10, 4, 64)
    with pytest.raises(RuntimeError, match="head shapes do not match"):
        cpu_kernels.paged_decode_attention(q, pool, pool, torch.zeros(2, 8, dtype=torch.int32),
                                           torch.tensor([0, 1]), torch.tensor([3, 3]), 0.125)
    fits = torch.randn(10, 3, 64)
    with pytest.raises(RuntimeError, match="one entry per query row"):
        cpu_kernels.paged_decode_attention(q, fits, fits, torch.zeros(2, 8, dtype=torch.int32),
                                           torch.tensor([0]), torch.tensor([3]), 0.125)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_large_enough_is_handed_out_a_request_at_a_time(dtype, threads):
    """From 4 requests per thread the kernel hands out whole requests (all K/V heads, the first pulling the slots
    into L2) instead of single heads; every request is still attended exactly once, on any number of threads."""
    lengths = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(11)).tolist()
    case = make_case([Request(n, 1) for n in lengths], 1, 9, 3, 64, dtype, decode=True, seed=13)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours, _ = case.run(TorchNativeBackend("cpu"))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(ours.float(), _reference(case), atol=TOLERANCE[dtype], rtol=0)


MIXED_REQUESTS = [Request(0, 24), Request(37, 1), Request(32, 9), Request(128, 1), Request(0, 1), Request(300, 1),
                  Request(128, 1, shares_prefix_with=3)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_one_token_extends_in_a_prefill_attend_in_place(page_size, monkeypatch):
    """A mixed-chunk batch: prefills (with and without a cached prefix) beside one-token extends on a prefix.
    The one-token rows go to the kernel in a single call, the rest to SDPA; together they equal SDPA for all."""
    case = make_case(MIXED_REQUESTS, page_size, 9, 3, 64, torch.float32, seed=page_size)
    calls = []
    kernel = cpu_kernels.paged_decode_attention
    monkeypatch.setattr(cpu_kernels, "paged_decode_attention",
                        lambda q, *args: calls.append(q.shape[0]) or kernel(q, *args))
    ours, pool = case.run(TorchNativeBackend("cpu"))
    assert calls == [4], "the one-token extends on a cached prefix were not attended in one kernel call"
    torch.testing.assert_close(ours, _reference(case), atol=TOLERANCE[torch.float32], rtol=0)
    assert torch.equal(pool.k_buffer[0][case.out_cache_loc], case.k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_pool_stores_a_steps_rows_in_one_native_call_as_index_put_would(dtype, monkeypatch):
    """`KVPool.set_kv` writes K and V with one `store_kv` call for a pool of the rows' dtype: the same bytes as
    two index_put, from strided views of a QKV projection, any slot order."""
    from toolkit.runtime.memory.kv_pool import KVPool

    pool = KVPool(256, 16, 1, 3, 64, dtype, "cpu")
    qkv = torch.randn(40, 15 * 64).to(dtype)
    k, v = qkv[:, 576:768].view(40, 3, 64), qkv[:, 768:].view(40, 3, 64)
    loc = torch.randperm(256)[:40] + 16
    calls = []
    kernel = cpu_kernels.store_kv
    monkeypatch.setattr(cpu_kernels, "store_kv", lambda *args: calls.append(1) or kernel(*args))
    pool.set_kv(0, loc, k, v)
    assert calls == [1]
    expected_k, expected_v = torch.zeros_like(pool.k_buffer[0]), torch.zeros_like(pool.v_buffer[0])
    expected_k[loc], expected_v[loc] = k, v
    assert torch.equal(pool.k_buffer[0], expected_k) and torch.equal(pool.v_buffer[0], expected_v)


def test_store_kv_refuses_a_slot_outside_the_pool_and_fp8_pools_keep_their_quantizing_path(monkeypatch):
    from toolkit.runtime.memory.kv_pool import KVPool

    pool = KVPool(64, 16, 1, 3, 64, torch.bfloat16, "cpu")
    rows = torch.randn(2, 3, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="slot 80 is outside the pool of 80"):
        cpu_kernels.store_kv(pool.k_buffer[0], pool.v_buffer[0], torch.tensor([3, 80]), rows, rows)
    fp8 = KVPool(64, 16, 1, 3, 64, torch.float8_e4m3fn, "cpu")
    monkeypatch.setattr(cpu_kernels, "store_kv", lambda *args: pytest.fail("an fp8 pool must quantize in Python"))
    fp8.set_kv(0, torch.tensor([20, 21]), rows, rows)
    assert torch.equal(fp8.k_buffer[0][20:22].float(), rows.float().to(torch.float8_e4m3fn).float())
