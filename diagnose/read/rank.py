"""Ranks: which process of a parallel server wrote a line (docs/log-formats.md §1, §9.1). The forms that name one
(SGLang's stamp tags, vLLM's process names and its stats line's engine, SGLang 0.1's and torch.distributed's rank
labels, SGLang 0.2.5's GPU tag) each give a `Rank`: the name, normalised, with its parts read once."""
from __future__ import annotations

import functools
import re

from toolkit.diagnose.read.batch import engine_tag

_PART = re.compile(r"(DP|TP|PP|EP|GPU)(\d+)")  # a part of a rank's name
_PROCESS_PART = re.compile(r"(?<![A-Za-z])(DP|TP|PP|EP)(\d+)")  # a part of a vLLM process's name
_WORKER_RANK = re.compile(r"\brank=(\d+)")


class Rank(str):
    """A rank as the log names it, normalised: `"DP1 TP0"`, `"GPU0"`, `"TP7"`, `"DP*"` (vLLM's engines aggregated),
    `""` (none named). Its parts are read once, where it is first named (`rank`): `dp`, `tp`, `pp`, `ep` and `gpu`,
    each its first such tag's number, None where it has none."""

    dp: int | None
    tp: int | None
    pp: int | None
    ep: int | None
    gpu: int | None

    @property
    def dp_group(self) -> str:
        """The data-parallel group it is in, as the log names it (`"DP1"`); `""` for none."""
        return f"DP{self.dp}" if self.dp is not None else ""


@functools.lru_cache(maxsize=4096)
def rank(name: str) -> Rank:
    """The rank of a normalised name (one object per name: a log names few)."""
    found = Rank(name)
    parts: dict[str, int] = {}
    for kind, number in _PART.findall(name):
        parts.setdefault(kind.lower(), int(number))
    found.dp, found.tp, found.pp, found.ep, found.gpu = (parts.get(k) for k in ("dp", "tp", "pp", "ep", "gpu"))
    return found


NO_RANK = rank("")


def rank_name(tags: str) -> Rank:
    """SGLang's stamp tags as one rank: `"  DP1  TP2 "` -> `DP1 TP2`."""
    return rank(" ".join(tags.split()))


def process_rank(process: str) -> Rank:
    """vLLM's process name as a rank: `EngineCore_DP1` -> `DP1`, `Worker_PP1_TP0` -> `PP1 TP0`, V1's
    multiprocessing `VllmWorker rank=7` -> `TP7` (its worker's rank), `APIServer` -> none."""
    parts = " ".join(f"{kind}{n}" for kind, n in _PROCESS_PART.findall(process))
    worker = _WORKER_RANK.search(process) if not parts else None
    return tp_rank(worker.group(1)) if worker else rank(parts)


def gpu_rank(gpu: str) -> Rank:
    """SGLang 0.2.5's `[gpu_id=N]` (or `[gpu=N]`) as a rank."""
    return rank(f"GPU{gpu}")


def tp_rank(number: str) -> Rank:
    """SGLang 0.1's `Rank N: ` and `[rank=N] `, and torch.distributed's `[rankN]: `, as a rank."""
    return rank(f"TP{number}")


def stats_rank(text: str, prefix_rank: Rank) -> Rank:
    """The rank of vLLM's stats line: its prefix's, unless that names no DP rank and the line names its engine (a DP
    rank): `Engine 001:` -> `DP1`; `N Engines Aggregated:` -> `DP*`."""
    tag = engine_tag(text)
    if tag is None or "DP" in prefix_rank:
        return prefix_rank
    return rank("DP*" if tag.aggregated else f"DP{tag.number}")
