"""Which event a message is, from how it starts (docs/log-formats.md §2-§9): SGLang's and vLLM's wordings.

`kind_of(line, start)` matches at the message start only; `error_kinds(text)` reads the kinds an exception's
own error lines name (a hard OOM or a leak raised as `RuntimeError: ...`), never a traceback's source lines.
"""
from __future__ import annotations

import re

_PATTERNS: dict[str, str] = {
    # batch lines first: they are most of a log
    "decode": r"Decode batch(?: \[\d+\])?[.,]|#running-req: \d",
    "prefill": r"Prefill batch(?: \[\d+\])?(?:[.,]|\(mixed )|new fill batch",
    "stats": r"(?:Engine \d{1,4}: |\d{1,4} Engines Aggregated: )?Avg prompt throughput: ",
    "access": r"INFO:\s+\S{1,100} - \"",
    # SGLang start-up
    "pool": r"max_total_num_tokens?=",
    "load_begin": r"[Ll]oad weight begin",
    "load_end": r"[Ll]oad weight end",
    "kv_alloc": r"KV Cache is allocated",
    "pool_end": r"Memory pool end",
    "graph_failed": r"Capture (?:cuda|CUDA) graph failed",
    "graph_begin": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph begin",
    "graph_end": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph end",
    "dist_init": r"Init torch distributed (?:begin|ends?)",
    "server_args": r"server_args=",
    "tokens_capped": r"max_total_tokens=-?\d+ is larger than the profiled",
    # SGLang errors
    "retract": r"[Dd]ecode out of memory happened|KV cache pool is full\. Retract requests|Testing retraction",
    "oom": r"(?:Prefill|Decode) out of memory|(?:torch\.)?(?:cuda\.)?OutOfMemoryError(?:: |\(['\"]CUDA out of memory)"
           r"|CUDA out of memory",
    "not_enough_memory": r"Not enought? memory|No available memory for the cache blocks|To serve at least one request "
                         r"with the models?'s max seq len|The model's max seq len \(\d+\) is larger than the maximum "
                         r"number of tokens|Failed to load model - not enough GPU memory",
    "leak": r"(?:KV cache pool leak|token_to_kv_pool_allocator memory leak|[\w.]{1,80} memory leak) detected"
            r"|Warning: available_size=",
    "watchdog": r"(?:\w{1,40} )?[Ww]atchdog timeout",
    "exception": r"\w{1,40} hit an exception|Traceback \(most recent call last\)|EngineCore (?:encountered a fatal "
                 r"error|failed to start)|Engine core initialization failed",
    "sigquit": r"Received sigquit",
    # load shedding and clients giving up (§6.4): `toolkit serve`'s lines, SGLang's disconnect wording
    "shed": r"Shed \d+ requests? (?:in the last \d+ s )?\(503",
    "queue_timeout": r"Queue timeout: aborted \d+ requests? ",
    "client_gone": r"the client of [A-Z]{1,10} \S{1,2000} disconnected before the response"
                   r"|(?:\[http_server\] Error: )?Request is disconnected from the client side",
    # vLLM
    "prefix_cache": r"Prefix cache hit rate: GPU: ",
    "spec_metrics": r"SpecDecoding metrics: |Speculative metrics: ",
    "preempt": r"Sequence group \S{1,200} is preempted (?:by|in) "
               r"|Preempted request \S{1,200} has been resumed",
    "kv_capacity": r"(?:[A-Z]{2,5}(?: \+ host)? )?KV cache size: [\d,]+ tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ",
    "gpu_blocks": r"# \w{1,10} blocks: \d",
    "kv_memory": r"Available KV cache memory: ",
    "memory_profile": r"Memory profiling (?:takes|results: )|the current vLLM instance can use total_gpu_memory"
                      r"|model weights take ",
    "weights_loaded": r"Model loading took |Loading model weights took ",
    "graph_captured": r"Graph capturing finished in ",
    "engine_config": r"Initializing an? (?:V1 )?LLM engine (?:\(v[^)]{1,40}\) )?with config: ",
    "engine_args": r"non-default args: ",
    "scheduler_config": r"Chunked prefill is enabled with max_num_batched_tokens=",
}
_MESSAGE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _PATTERNS.items()))
# Multi-line records: their continuation lines (indented, an error line, vLLM's wrapped profile) join them.
OPENERS = frozenset({"exception", "oom", "leak", "memory_profile"})
_ERROR_LINE = re.compile(r"^\s*[\w.]{0,80}(?:Error|Exception|Warning): (.*)$", re.M)
_ERROR_KINDS = frozenset({"oom", "leak", "not_enough_memory"})
# An error line on its own (no traceback open): `ValueError: ...`, in backticks, or a repr `Error('...`.
_ERROR_START = re.compile(r"`?[\w.]{0,80}(?:Error|Exception)(?:: |\(['\"])")


def kind_of(line: str, start: int = 0) -> str | None:
    """The event kind of the message starting at `start`, None when it is none of them."""
    m = _MESSAGE.match(line, start)
    return m.lastgroup if m is not None else None


def line_kind(line: str, start: int = 0) -> str | None:
    """The kind of a line that opens no record: `kind_of`, else the oom / leak / not_enough_memory kind of an
    error line (`ValueError: No available memory ...`) read on its own."""
    kind = kind_of(line, start)
    if kind is not None:
        return kind
    m = _ERROR_START.match(line, start)
    named = kind_of(line, m.end()) if m is not None else None
    return named if named in _ERROR_KINDS else None


def error_kinds(text: str) -> list[str]:
    """The kinds (oom, leak, not_enough_memory) named by the error lines of an exception's text."""
    found: list[str] = []
    for message in _ERROR_LINE.findall(text):
        kind = kind_of(message)
        if kind in _ERROR_KINDS and kind not in found:
            found.append(kind)
    return found
