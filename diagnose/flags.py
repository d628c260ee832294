"""The engine that wrote the log, and what the rules quote in its words: an idea's flag (from the one table,
`diagnose/ideas.py`), the fp8 KV dtype, and the static memory fraction (docs/log-formats.md §10)."""
from __future__ import annotations

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.ideas import IDEAS, Engine

FP8_KV = ("fp8_e5m2", "fp8")


def engine_of(config: ServerConfig) -> Engine:
    """The engine whose words the advice uses: vLLM's for a vLLM log, else SGLang's."""
    return "vllm" if config.vllm else "sglang"


def flag(config: ServerConfig, idea: str) -> str:
    """The flag of `idea` in the engine that wrote the log (the other engine's when that one has none)."""
    known = IDEAS[idea]
    return known.flag(engine_of(config)) or known.sglang or known.vllm or idea


def fp8_kv(config: ServerConfig) -> str:
    return FP8_KV[1 if config.vllm else 0]


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
