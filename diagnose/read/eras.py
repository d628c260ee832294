"""The engine's release, as the log's forms prove it: SGLang's eras (docs/log-formats.md §12), vLLM's generation (V0
prints swapped and pending requests in its stats line, V1 neither, §9.2)."""
from __future__ import annotations

from toolkit.diagnose.read.batch import DECODE_LABEL, NEW_FILL_LABEL

GPU_TAG = "[gpu_id="  # SGLang 0.2.5's rank tag, part of a line's prefix (the rank it names is a GPU's)
ERAS = ("0.1.14", "0.2.5", "0.2.15", "0.3.6", "0.4.3", "0.4.9", "0.5.3", "0.5.5", "0.5.23")

# (era it proves at least, substring of a record's text)
MARKERS: tuple[tuple[str, str], ...] = (
    ("0.5.23", "#new_tokens_gained"),
    ("0.5.23", "#pending-token"),
    ("0.5.5", DECODE_LABEL + ","),
    ("0.5.5", DECODE_LABEL + " ["),
    ("0.5.5", "accept rate:"),
    ("0.5.3", "#aborted_retracted_reqs"),
    ("0.4.9", "KV cache pool is full"),
    ("0.4.9", "cuda graph:"),
    ("0.4.9", "available_gpu_mem="),
    ("0.4.9", "available_cpu_mem="),
    ("0.4.3", "chunked_prefill_size="),
    ("0.3.6", "%, token usage:"),
    ("0.2.15", DECODE_LABEL + "."),
    ("0.2.5", GPU_TAG),
    ("0.1.14", NEW_FILL_LABEL),
    ("0.1.14", "decode out of memory happened"),
)
# Forms that only one era printed: they decide alone.
EXACT: tuple[tuple[str, str], ...] = (("0.2.5", GPU_TAG), ("0.1.14", NEW_FILL_LABEL))


def era_of(texts: dict[str, str]) -> str | None:
    """The newest era proven by any marker in `texts` (one sample record per kind); forms that only one era
    printed decide alone."""
    for era, marker in EXACT:
        if any(marker in t for t in texts.values()):
            return era
    best = -1
    for era, marker in MARKERS:
        if any(marker in t for t in texts.values()):
            best = max(best, ERAS.index(era))
    return ERAS[best] if best >= 0 else None
V0_STATS = ("Swapped:", "Pending:")


def vllm_generation(stats: str | None) -> str | None:
    """`V0` or `V1` as vLLM's first stats line shows it; None without one."""
    if not stats:
        return None
    return "V0" if any(form in stats for form in V0_STATS) else "V1"
