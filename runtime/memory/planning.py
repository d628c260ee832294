"""How big the KV pool is and the defaults SGLang derives from device memory (docs/scheduling.md §4).

Pure arithmetic: inputs are memory figures in GiB (or MiB for the defaults table), so it is testable on CPU.

CPU budget: without `--mem-fraction-static`, the CPU KV pool gets min(2 GiB, 25% of available RAM) — enough
for ~90k tokens of SmolLM2-135M in bfloat16 — instead of SGLang's 90%-of-the-device, because the host also runs
everything else. `--max-total-tokens` sets the pool size directly; `--mem-fraction-static` applies SGLang's
formula to RAM. The RAM budget is the host's: the scheduler processes on it (TP ranks, DP replicas) share it
equally, so a TP rank, holding its share of the KV heads, gets as many tokens as one process would.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
CPU_KV_BUDGET_GIB = 2.0
CPU_KV_BUDGET_FRACTION = 0.25
CPU_CHUNKED_PREFILL_SIZE = 2048
# NOTE: with one-token pages, the requests of a decode batch take consecutive slots, so each request's decode tokens
# lie a batch apart in the pool; 16-token pages keep 16 of them together for the CPU decode kernel's reads
# (measured in process, 64 x 256/128, pages 1 vs 16 alternated: 11.61 vs 11.12 s).
CPU_PAGE_SIZE = 16
REQ_POOL_MIN, REQ_POOL_MAX = 2048, 4096


def default_page_size(device_type: str) -> int:
    """`--page-size` left unset: 16 on a CPU, SGLang's 1 elsewhere."""
    return CPU_PAGE_SIZE if device_type == "cpu" else 1


class NotEnoughMemoryError(RuntimeError):
    pass


NOT_ENOUGH_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."


@dataclass(frozen=True)
class PoolPlan:
    max_total_num_tokens: int
    warning: str | None = None


def profile_max_num_tokens(
    avail_before_weights_gib: float,
    avail_after_weights_gib: float,
    mem_fraction_static: float,
    bytes_per_token: int,
) -> int:
    """SGLang's `profile_max_num_token`: what is left of the static fraction after the weights, in tokens."""
    rest_gib = avail_after_weights_gib - avail_before_weights_gib * (1 - mem_fraction_static)
    return int(rest_gib * GIB // bytes_per_token)


def plan_cuda_pool(
    avail_before_weights_gib: float,
    avail_after_weights_gib: float,
    mem_fraction_static: float,
    bytes_per_token: int,
    page_size: int,
    max_total_tokens: int | None,
) -> PoolPlan:
    profiled = profile_max_num_tokens(
        avail_before_weights_gib, avail_after_weights_gib, mem_fraction_static, bytes_per_token
    )
    warning, tokens = None, profiled
    if max_total_tokens is not None:
        if max_total_tokens > profiled:
            warning = (
                f"max_total_tokens={max_total_tokens} is larger than the profiled value {profiled}. "
                "Use the profiled value instead."
            )
        else:
            tokens = max_total_tokens
    tokens = tokens // page_size * page_size
    if tokens <= 0:
        raise NotEnoughMemoryError(f"{NOT_ENOUGH_MEMORY} Current value: mem_fraction_static={mem_fraction_static}")
    return PoolPlan(tokens, warning)


def plan_cpu_pool(
    avail_ram_gib: float,
    avail_after_weights_gib: float,
    bytes_per_token: int,
    page_size: int,
    max_total_tokens: int | None,
    mem_fraction_static: float | None,
    host_processes: int = 1,
) -> PoolPlan:
    """`host_processes`: the scheduler processes sharing this host's RAM budget (`--max-total-tokens` is per
    process)."""
    if max_total_tokens is not None:
        tokens = max_total_tokens
    elif mem_fraction_static is not None:
        tokens = profile_max_num_tokens(avail_ram_gib, avail_after_weights_gib, mem_fraction_static,
                                        bytes_per_token * host_processes)
    else:
        budget_gib = min(CPU_KV_BUDGET_GIB, CPU_KV_BUDGET_FRACTION * avail_after_weights_gib) / host_processes
        tokens = int(budget_gib * GIB // bytes_per_token)
    tokens = tokens // page_size * page_size
    if tokens <= 0:
        raise NotEnoughMemoryError(f"{NOT_ENOUGH_MEMORY} Current value: mem_fraction_static={mem_fraction_static}")
    if tokens * bytes_per_token > avail_after_weights_gib * GIB:
        raise NotEnoughMemoryError(
            f"a KV pool of {tokens} tokens needs {tokens * bytes_per_token / GIB:.2f} GB but only "
            f"{avail_after_weights_gib:.2f} GB of RAM is available; lower --max-total-tokens"
        )
    return PoolPlan(tokens)


@dataclass(frozen=True)
class DeviceDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float


def cuda_defaults(gpu_mem_mib: float, tp_size: int = 1, pp_size: int = 1) -> DeviceDefaults:
    """SGLang 0.5.3's defaults by per-GPU memory (`server_args.py`)."""
    gpu_gib = gpu_mem_mib / 1024
    small_tp = tp_size < 4
    if gpu_gib < 20:
        chunk, cgmb = 2048, 8
    elif gpu_gib < 35:
        chunk, cgmb = 2048, 16 if small_tp else 80
    elif gpu_gib < 60:
        chunk, cgmb = 4096, 32 if small_tp else 160
    elif gpu_gib < 160:
        chunk, cgmb = 8192, 256 if small_tp else 512
    else:
        chunk, cgmb = 16384, 512
    reserved_mib = 512 + max(chunk, 2048) * 1.5 + cgmb * 2 + tp_size * pp_size / 8 * 1024
    if gpu_gib > 60:
        reserved_mib = max(reserved_mib, 10 * 1024)
    fraction = round((gpu_mem_mib - reserved_mib) / gpu_mem_mib, 3)
    return DeviceDefaults(chunk, cgmb, fraction)


def default_max_running_requests(max_total_num_tokens: int, context_len: int) -> int:
    """The scheduler's cap when `--max-running-requests` is unset: SGLang's min(half the pool, request pool)."""
    return min(max_total_num_tokens // 2, req_to_token_pool_size(max_total_num_tokens, context_len))


def req_to_token_pool_size(max_total_num_tokens: int, context_len: int) -> int:
    return max(REQ_POOL_MIN, min(REQ_POOL_MAX, int(max_total_num_tokens / context_len * 512)))
