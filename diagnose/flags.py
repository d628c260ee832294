"""The flags a finding names, per engine: each tuning idea has an SGLang flag and a vLLM flag
(docs/log-formats.md §10 lists them side by side)."""
from __future__ import annotations

from toolkit.diagnose.config import ServerConfig

FLAGS: dict[str, tuple[str, str]] = {
    "kv_memory": ("--mem-fraction-static", "--gpu-memory-utilization"),
    "running_cap": ("--max-running-requests", "--max-num-seqs"),
    "prefill_budget": ("--chunked-prefill-size", "--max-num-batched-tokens"),
    "context": ("--context-length", "--max-model-len"),
    "kv_dtype": ("--kv-cache-dtype", "--kv-cache-dtype"),
    "graph_max_bs": ("--cuda-graph-max-bs", "--max-cudagraph-capture-size"),
    "graphs_off": ("--disable-cuda-graph", "--enforce-eager"),
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
    "quantization": ("--quantization", "--quantization"),
}
FP8_KV = ("fp8_e5m2", "fp8")


def flag(config: ServerConfig, idea: str) -> str:
    """The flag of `idea` in the engine that wrote the log (SGLang's when the engine is unknown)."""
    return FLAGS[idea][1 if config.vllm else 0]


def fp8_kv(config: ServerConfig) -> str:
    return FP8_KV[1 if config.vllm else 0]


def engine_word(config: ServerConfig) -> str:
    return "vLLM" if config.vllm else "SGLang"


VLLM_DEFAULT_UTILIZATION = 0.9


def memory_fraction(config: ServerConfig) -> tuple[float | None, str | None]:
    """(the static memory fraction, as the finding quotes it): SGLang's `--mem-fraction-static`, vLLM's
    `--gpu-memory-utilization` (its default 0.9 when the log does not name it)."""
    value = config.mem_fraction_static
    if value is not None:
        return value, f"{value:g}"
    if config.vllm:
        return VLLM_DEFAULT_UTILIZATION, f"{VLLM_DEFAULT_UTILIZATION:g} (default)"
    return None, None
