"""The defaults SGLang would have chosen in each era (docs/log-formats.md §12); the eras and the log forms that
prove one are `diagnose.read.eras`."""
from __future__ import annotations

from toolkit.diagnose.read.eras import ERAS


def _at_least(era: str | None, version: str) -> bool:
    return era is not None and ERAS.index(era) >= ERAS.index(version)


def default_cuda_graph_max_bs(era: str | None, gpu_mem_gb: float | None, tp: int = 1) -> int:
    """cuda_graph_max_bs SGLang would pick for this GPU size and TP (docs/log-formats.md §12)."""
    g = gpu_mem_gb if gpu_mem_gb is not None else 80.0
    if not _at_least(era, "0.4.3"):
        return 4 if (_at_least(era, "0.3.6") and g < 25) else 160
    if not _at_least(era, "0.5.3"):
        if g < (25 if era == "0.4.3" else 35):
            return 8 if tp < 4 else 80
        return 160
    if g < 20:
        return 8
    if g < 35:
        small = (48, 160) if era == "0.5.23" else (16, 80)
        return small[0] if tp < 4 else small[1]
    if g < 60:
        return 32 if tp < 4 else 160
    if g < 160:
        return 256 if tp < 4 else 512
    return 512


def default_schedule_policy(era: str | None) -> str | None:
    """`lpm` up to 0.4.3, `fcfs` from 0.4.9; None when the era is unknown."""
    if era is None:
        return None
    return "fcfs" if _at_least(era, "0.4.9") else "lpm"


def default_max_prefill_tokens(era: str | None) -> int | None:
    """16384 since 0.2 (an unknown era is read as a recent one); None before, when the budget was derived from the
    context length and the pool."""
    return 16384 if era is None or _at_least(era, "0.2.5") else None
