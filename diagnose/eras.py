"""SGLang eras: recognising one from its log forms, and the defaults it would have chosen (docs/log-formats.md §12)."""
from __future__ import annotations

ERAS = ("0.1.14", "0.2.5", "0.2.15", "0.3.6", "0.4.3", "0.4.9", "0.5.3", "0.5.5", "0.5.23")

# (era it proves at least, substring of a record's text)
_MARKERS: tuple[tuple[str, str], ...] = (
    ("0.5.23", "#new_tokens_gained"),
    ("0.5.23", "#pending-token"),
    ("0.5.5", "Decode batch,"),
    ("0.5.5", "Decode batch ["),
    ("0.5.5", "accept rate:"),
    ("0.5.3", "#aborted_retracted_reqs"),
    ("0.4.9", "KV cache pool is full"),
    ("0.4.9", "cuda graph:"),
    ("0.4.9", "available_gpu_mem="),
    ("0.4.9", "available_cpu_mem="),
    ("0.4.3", "chunked_prefill_size="),
    ("0.3.6", "%, token usage:"),
    ("0.2.15", "Decode batch."),
    ("0.2.5", "[gpu_id="),
    ("0.1.14", "new fill batch"),
    ("0.1.14", "decode out of memory happened"),
)


_EXACT: tuple[tuple[str, str], ...] = (("0.2.5", "[gpu_id="), ("0.1.14", "new fill batch"))


def era_of(texts: dict[str, str]) -> str | None:
    """The newest era proven by any marker in `texts` (one sample record per kind); forms that only one era
    printed decide alone."""
    for era, marker in _EXACT:
        if any(marker in t for t in texts.values()):
            return era
    best = -1
    for era, marker in _MARKERS:
        if any(marker in t for t in texts.values()):
            best = max(best, ERAS.index(era))
    return ERAS[best] if best >= 0 else None


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
