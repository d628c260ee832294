"""Events: one recognised log message (docs/log-formats.md §1-§8), the only event type of `toolkit diagnose`.

Fields are read lazily from `text` (`diagnose.fields`): the parsers only classify. Batch and stats lines (the
time series) become columns in `diagnose.series`; every other event stays an `Event`.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

from toolkit.diagnose.fields import Value, parse_fields

Kind = Literal[
    # SGLang (docs/log-formats.md §2-§6)
    "decode",            # Decode batch ... (every decode_log_interval steps)
    "prefill",           # Prefill batch ... / new fill batch ...
    "access",            # HTTP access line (uvicorn), SGLang or vLLM
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
    "oom",               # Prefill/Decode out of memory (hard OOM), CUDA out of memory
    "not_enough_memory", # Not enough memory for the KV pool at start-up (SGLang and vLLM wordings)
    "leak",              # KV cache pool leak / memory leak detected
    "watchdog",          # Watchdog timeout
    "exception",         # Scheduler hit an exception / Traceback / EngineCore fatal error (multi-line)
    "sigquit",           # Received sigquit from a child process
    # load shedding and clients giving up (docs/log-formats.md §6.4)
    "shed",              # Shed N requests[ in the last S s] (503, Retry-After 1 s): queue_full: a, waiting_timeout: b
    "queue_timeout",     # Queue timeout: aborted N requests that waited more than S s, #queue-req: Q
    "client_gone",       # the client of POST /path disconnected ... / Request is disconnected from the client side
    # vLLM (docs/log-formats.md §9)
    "stats",             # Engine 000: Avg prompt throughput: ..., Running: ..., Waiting: ..., KV cache usage
    "prefix_cache",      # V0: Prefix cache hit rate: GPU: x%, CPU: y%
    "spec_metrics",      # SpecDecoding metrics: ... / Speculative metrics: ...
    "preempt",           # V0: Sequence group N is preempted by PreemptionMode.X mode ...
    "kv_capacity",       # GPU KV cache size: N tokens[, Maximum concurrency for L tokens per request: Cx]
    "max_concurrency",   # Maximum concurrency for L tokens per request: Cx (a line of its own before 0.11)
    "gpu_blocks",        # # GPU blocks: N, # CPU blocks: M
    "kv_memory",         # Available KV cache memory: X GiB
    "memory_profile",    # Memory profiling takes ... / total_gpu_memory (X) x gpu_memory_utilization (U) ...
    "weights_loaded",    # Model loading took X GiB and S seconds / Loading model weights took X GB
    "graph_captured",    # Graph capturing finished in S secs, took X GiB
    "engine_config",     # Initializing a V1 LLM engine (vX) with config: model=..., ...
    "engine_args",       # non-default args: {...}
    "scheduler_config",  # Chunked prefill is enabled with max_num_batched_tokens=N.
]

KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
BATCH_KINDS = ("decode", "prefill", "stats")  # the time series: kept as columns, not as events


class Event(NamedTuple):
    """One recognised message. `line` is 1-based in its source; `time` is seconds on the log's clock (naive
    timestamps read as UTC; `None` when the era prints none); `rank` is the normalised rank tag (`""` when
    none, else e.g. `"DP1 TP0"` or `"GPU0"`); `text` is the message from its start (after the time, rank and
    process prefix), with a multi-line record's continuation lines joined by newlines."""

    kind: str
    line: int
    time: float | None
    rank: str
    text: str
    source: int = 0

    @property
    def fields(self) -> dict[str, Value]:
        return parse_fields(self.kind, self.text)
