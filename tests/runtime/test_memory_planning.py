"""KV pool sizing and SGLang's device-memory defaults, from given memory figures (no device needed)."""
from __future__ import annotations

import pytest

from toolkit.runtime.memory.planning import (
    GIB,
    NotEnoughMemoryError,
    cuda_defaults,
    default_max_running_requests,
    plan_cpu_pool,
    plan_cuda_pool,
    profile_max_num_tokens,
    req_to_token_pool_size,
)

LLAMA_8B_BF16_BYTES_PER_TOKEN = 8 * 128 * 32 * 2 * 2  # kv heads * head_dim * layers * (K,V) * bf16 = 131072


def test_profile_uses_sglang_formula():
    # H100 80 GB: 79.0 GiB free before weights, 64.0 after 15 GiB of weights, fraction 0.85
    tokens = profile_max_num_tokens(79.0, 64.0, 0.85, LLAMA_8B_BF16_BYTES_PER_TOKEN)
    rest = 64.0 - 79.0 * (1 - 0.85)  # 52.15 GiB for the KV pool
    assert tokens == int(rest * GIB // LLAMA_8B_BF16_BYTES_PER_TOKEN) == 427212


def test_pool_grows_and_shrinks_with_mem_fraction_static():
    sizes = [plan_cuda_pool(79.0, 64.0, f, LLAMA_8B_BF16_BYTES_PER_TOKEN, 1, None).max_total_num_tokens
             for f in (0.7, 0.8, 0.9)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert sizes[2] - sizes[1] == pytest.approx(0.1 * 79.0 * GIB / LLAMA_8B_BF16_BYTES_PER_TOKEN, abs=2)


def test_max_total_tokens_caps_the_pool_and_warns_when_larger():
    plan = plan_cuda_pool(79.0, 64.0, 0.85, LLAMA_8B_BF16_BYTES_PER_TOKEN, 16, 100_000)
    assert (plan.max_total_num_tokens, plan.warning) == (100_000, None)
    plan = plan_cuda_pool(79.0, 64.0, 0.85, LLAMA_8B_BF16_BYTES_PER_TOKEN, 16, 10_000_000)
    assert plan.max_total_num_tokens == 427200  # profiled, rounded down to whole pages of 16
    assert plan.warning == ("max_total_tokens=10000000 is larger than the profiled value 427212. "
                            "Use the profiled value instead.")


def test_not_enough_memory_names_the_flag():
    with pytest.raises(NotEnoughMemoryError, match=r"increase --mem-fraction-static.*mem_fraction_static=0.1"):
        plan_cuda_pool(79.0, 64.0, 0.1, LLAMA_8B_BF16_BYTES_PER_TOKEN, 1, None)


def test_cpu_default_budget_is_modest():
    bytes_per_token = 30 * 3 * 64 * 2 * 2  # SmolLM2-135M in bf16: 23040
    plan = plan_cpu_pool(22.0, 21.7, bytes_per_token, 1, None, None)
    assert plan.max_total_num_tokens == int(2 * GIB // bytes_per_token) == 93206  # min(2 GiB, 25% of RAM)
    small = plan_cpu_pool(4.0, 3.0, bytes_per_token, 1, None, None)
    assert small.max_total_num_tokens == int(0.75 * GIB // bytes_per_token)
    assert plan_cpu_pool(22.0, 21.7, bytes_per_token, 16, 5000, None).max_total_num_tokens == 4992
    with pytest.raises(NotEnoughMemoryError, match="lower --max-total-tokens"):
        plan_cpu_pool(22.0, 1.0, bytes_per_token, 1, 10_000_000, None)


def test_cpu_budget_is_shared_by_the_scheduler_processes_of_the_host():
    """SmolLM2-135M over 3 TP ranks: each holds 1 of the 3 KV heads and a third of the 2 GiB: the same tokens."""
    one = plan_cpu_pool(22.0, 21.7, 30 * 3 * 64 * 2 * 2, 1, None, None)
    rank = plan_cpu_pool(22.0, 21.7, 30 * 1 * 64 * 2 * 2, 1, None, None, host_processes=3)
    assert abs(rank.max_total_num_tokens - one.max_total_num_tokens) <= 1
    replica = plan_cpu_pool(22.0, 21.7, 30 * 3 * 64 * 2 * 2, 1, None, None, host_processes=2)
    assert replica.max_total_num_tokens == int(GIB // (30 * 3 * 64 * 2 * 2))
    assert plan_cpu_pool(22.0, 21.7, 23040, 1, 5000, None, host_processes=4).max_total_num_tokens == 5000


@pytest.mark.parametrize("gpu_gib, chunk, cgmb, fraction", [
    (16, 2048, 8, 0.772),    # T4-class: 3728 MiB reserved
    (24, 2048, 16, 0.848),   # L4 / A10: 3744 MiB
    (48, 4096, 32, 0.861),   # L40S / A6000: 6848 MiB
    (80, 8192, 256, 0.836),  # H100 / A100-80: 13440 MiB
    (141, 8192, 256, 0.907),  # H200: 13440 MiB
    (192, 16384, 512, 0.867),  # B200 / MI300: 26240 MiB
])
def test_defaults_by_gpu_memory(gpu_gib, chunk, cgmb, fraction):
    defaults = cuda_defaults(gpu_gib * 1024)
    assert (defaults.chunked_prefill_size, defaults.cuda_graph_max_bs) == (chunk, cgmb)
    assert defaults.mem_fraction_static == fraction


def test_max_running_requests_default_follows_the_pool():
    assert req_to_token_pool_size(665_690, 65_536) == 4096  # clamp(5200, 2048, 4096)
    assert req_to_token_pool_size(100_000, 131_072) == 2048
    assert default_max_running_requests(665_690, 65_536) == 4096
    assert default_max_running_requests(3000, 8192) == 1500
