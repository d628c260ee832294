"""Events: one recognised log record, with its kind, time, rank and source line number.

Fields are read lazily from `text` (see `diagnose.fields`): the parser's hot path only classifies lines.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

from toolkit.diagnose.fields import Value, parse_fields

Kind = Literal[
    "decode",            # Decode batch ... (every decode_log_interval steps)
    "prefill",           # Prefill batch ... / new fill batch ...
    "access",            # HTTP access line (uvicorn)
    "pool",              # max_total_num_tokens=..., ..., available_gpu_mem=... GB
    "load_begin",        # Load weight begin. avail mem=...
    "load_end",          # Load weight end. type=..., dtype=..., avail mem=..., mem usage=...
    "kv_alloc",          # KV Cache is allocated. #tokens: ..., K size: ..., V size: ...
    "pool_end",          # Memory pool end. avail mem=...
    "graph_begin",       # Capture cuda graph begin ...
    "graph_end",         # Capture cuda graph end ...
    "graph_failed",      # Capture cuda graph failed: ...
    "dist_init",         # Init torch distributed begin/ends
    "server_args",       # server_args=ServerArgs(...)
    "tokens_capped",     # max_total_tokens=X is larger than the profiled value Y
    "retract",           # decode OOM / KV cache pool is full. Retract requests.
    "oom",               # Prefill/Decode out of memory (hard OOM, multi-line)
    "not_enough_memory", # Not enough memory. Please try to increase --mem-fraction-static.
    "leak",              # KV cache pool leak / memory leak detected
    "watchdog",          # Watchdog timeout
    "exception",         # Scheduler hit an exception / Traceback (multi-line)
    "sigquit",           # Received sigquit from a child process
]

KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]


class Event(NamedTuple):
    """One recognised record. `line` is 1-based in its source; `time` is seconds on the log's clock
    (naive timestamps read as UTC; `None` when the era prints none); `rank` is the normalised rank tag
    (`""` when none, else e.g. `"DP1 TP0"` or `"GPU0"`); `text` holds the record from at least its label on
    (the whole line for the hot kinds, the joined lines for multi-line records)."""

    kind: str
    line: int
    time: float | None
    rank: str
    text: str
    source: int = 0

    @property
    def fields(self) -> dict[str, Value]:
        return parse_fields(self.kind, self.text)
