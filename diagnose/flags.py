"""The engine that wrote the log, and what the rules quote in its words: an idea's flag (from the one table,
`diagnose/ideas.py`), the fp8 KV dtype, and the static memory fraction (docs/log-formats.md §10)."""
from __future__ import annotations

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.ideas import IDEAS, Change, Engine

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
MAX_FRACTION = 0.95  # the highest static memory fraction the rules advise (activations and graphs need the rest)
STEP = 0.05


def memory_fraction(config: ServerConfig) -> tuple[float | None, str | None]:
    """(the static memory fraction, as the finding quotes it): SGLang's `--mem-fraction-static`, vLLM's
    `--gpu-memory-utilization` (its default 0.9 when the log does not name it)."""
    value = config.mem_fraction_static
    if value is not None:
        return value, f"{value:g}"
    if config.vllm:
        return VLLM_DEFAULT_UTILIZATION, f"{VLLM_DEFAULT_UTILIZATION:g} (default)"
    return None, None


def more_kv_memory(config: ServerConfig) -> Change | None:
    """The static memory fraction STEP higher, at most MAX_FRACTION; None where the log's is there already (more KV
    memory is not on offer: ask for fewer requests at once instead)."""
    current, _ = memory_fraction(config)
    if current is None:
        return Change("kv_memory", direction=1)
    if current >= MAX_FRACTION:
        return None
    return Change("kv_memory", f"{min(MAX_FRACTION, current + STEP):.2f}")
