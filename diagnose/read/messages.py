"""The messages: their names (event kinds), how each starts (docs/log-formats.md §2-§9, SGLang's and vLLM's
wordings), and which kind a message is. `kind_of(line, start)` matches at the message start only, with one regex
compiled from `STARTS`; the fast path reads the batch and access lines' starts byte-wise from the same literals.

At a start `kind_of` tries only the kinds whose pattern can begin with its first character (read from each
pattern once, by CPython's own regex parser; a pattern it cannot narrow is tried at every start): the same
answer as the whole alternation, in about half the time. A line that opens no record may be an error line
(`ValueError: No available memory ...`) that names an error kind of its own (`line_kind`); what a record's error
lines name is `diagnose.read.errors`'.
"""
from __future__ import annotations

import functools
import re
from re import _constants, _parser  # type: ignore[attr-defined]
from typing import Literal

from toolkit.diagnose.read.batch import DECODE_LABEL, ENGINE, LABEL_ENDS, NEW_FILL_LABEL, PREFILL_LABEL, RUNNING

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
    "graph_progress",    # Capturing batches (bs=N avail_mem=X GB): P%|...| (the capture's progress bar, 0.4.5+; piecewise
                         # graphs: Capturing num tokens (num_tokens=N avail_mem=X GB))
    "dist_init",         # Init torch distributed begin/ends (0.1: Init torch begin. Avail mem=...)
    "server_args",       # server_args=ServerArgs(...)
    "tokens_capped",     # max_total_tokens=X is larger than the profiled value Y
    "retract",           # decode OOM / KV cache pool is full. Retract requests.
    "oom",               # Prefill/Decode out of memory (hard OOM), CUDA out of memory
    "not_enough_memory", # Not enough memory for the KV pool at start-up (SGLang and vLLM wordings)
    "leak",              # KV cache pool leak / memory leak detected
    "watchdog",          # Watchdog timeout
    "exception",         # Scheduler hit an exception / Traceback / EngineCore fatal error (multi-line)
    "sigquit",           # Received sigquit from a child process
    "engine_dead",       # V0: MQLLMEngine is already dead, terminating server process (a request found the engine dead)
    "stop",              # an orderly stop asked for: a signal received, the HTTP server shutting down (either engine)
    "input_too_long",    # Input length (N tokens) exceeds the maximum allowed length (M tokens). ... (rejected)
    "prompt_too_long",   # V0: Input prompt (N tokens) is too long and exceeds limit of M (the scheduler drops it)
    # load shedding and clients giving up (docs/log-formats.md §6.4)
    "shed",              # Shed N requests[ in the last S s] (503, Retry-After 1 s): queue_full: a, waiting_timeout: b
    "queue_timeout",     # Queue timeout: aborted N requests that waited more than S s, #queue-req: Q
    "client_gone",       # the client of POST /path disconnected ... / Request is disconnected from the client side
    # PD disaggregation (docs/log-formats.md §6.3)
    "kv_transfer_failed",  # Prefill|Decode transfer failed for request rank=N ... with exception KVTransferError(...): why
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
    "mm_profile",        # V0: Starting profile run for multi-modal models. (a dummy batch of max_num_seqs inputs)
    "weights_loaded",    # Model loading took X GiB and S seconds / Loading model weights took X GB
    "graph_captured",    # Graph capturing finished in S secs, took X GiB
    "engine_config",     # Initializing a V1 LLM engine (vX) with config: model=..., ...
    "engine_args",       # non-default args: {...}
    "scheduler_config",  # Chunked prefill is enabled with max_num_batched_tokens=N. / max_num_scheduled_tokens is set
                         # to N based on the speculative decoding settings. (the step budget draft slots leave)
    # either engine: what the user ran (docs/log-formats.md §5); read on lines without time only, not in `STARTS`
    "launch_command",    # python -m sglang.launch_server ... / vllm serve MODEL ... (pasted beside the log)
]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
SGLANG_BATCH_KINDS = ("decode", "prefill")  # the fast path's kinds, in its code order
BATCH_KINDS = (*SGLANG_BATCH_KINDS, "stats")  # the time series: kept as columns, not as events
# Messages only one engine prints (an access line, an OOM, an exception can be either's).
SGLANG_KINDS = frozenset({"decode", "prefill", "pool", "load_begin", "load_end", "kv_alloc", "pool_end",
                          "graph_begin", "graph_end", "graph_failed", "graph_progress", "dist_init", "server_args",
                          "tokens_capped", "retract", "leak", "watchdog", "sigquit", "shed", "queue_timeout",
                          "client_gone", "kv_transfer_failed", "input_too_long"})
VLLM_KINDS = frozenset({"stats", "prefix_cache", "spec_metrics", "preempt", "kv_capacity", "max_concurrency",
                        "gpu_blocks", "kv_memory", "memory_profile", "mm_profile", "weights_loaded", "graph_captured",
                        "engine_config", "engine_args", "scheduler_config", "engine_dead",
                        "prompt_too_long"})

# Facts a line's prefix tells, as events (one per source, at the first line that tells it; no message: counted in no
# statistic, exported nowhere): vLLM's own logger wrote a line the parser read (`vllm_logger`: the log is vLLM's
# where its messages could be either's), a colocated RL framework's Ray actor wrote a start-up line (`colocated`).
FACT_KINDS = frozenset({"vllm_logger", "colocated"})

# Multi-line records: their continuation lines (indented, an error line, vLLM's wrapped profile) join them.
OPENERS = frozenset({"exception", "oom", "leak", "memory_profile", "launch_command", "not_enough_memory"})
# vLLM's max seq len refusal wrapped by a paste (kaito#2132): a `not_enough_memory` record continues with these only
REFUSAL_WRAPPED = r"\(?[\d.]{1,20} GiB KV cache is needed|Based on the available memory"
LINE_CONTINUES = "\\"  # a shell line that ends so continues on the next (a launch command's only continuation)
TRACEBACK_HEAD = "Traceback (most recent call last)"
# a traceback's frame line, the first line of one whose head the excerpt cut (vllm#19186)
TRACEBACK_FRAME = r'\s{1,8}File "[^"]{1,1000}", line \d{1,7}, in '
# where a progress bar's line ends (tqdm's `[elapsed<left, rate]`, no newline): what is printed next runs on in it
PROGRESS_END = r"(?:it/s|s/it)\]"
CONTINUATION = (r"\s|\w{0,80}(?:Error|Exception)\b|Try to allocate|Ava(?:ilable|liable) tokens|[\w.()]{0,80}available_size"
                r"|[\w.()]{0,80}evictable_size|KV cache pool leak detected|During handling|The above exception"
                r"|the current vLLM instance can use|model weights take|the rest of the memory"
                r"|Failed to pickle inputs of failed execution|Completed writing input of failed execution|"
                + REFUSAL_WRAPPED)
SELF_CONTINUING = frozenset({"leak", "memory_profile"})  # records whose later lines start like their first

UVICORN_ACCESS = "INFO:     "  # uvicorn's access line: `INFO:     CLIENT - "METHOD PATH HTTP/V" STATUS`
ACCESS_DASH = ' - "'
ACCESS_HTTP = " HTTP/"
MAX_CLIENT_CHARS = 100
ACCESS_PID = r"(?: \d{1,10})?"  # KServe's access format prints the server's process id after the client (kserve#4470)
ACCESS_FIELDS = (f"(?P<client>\\S{{1,{MAX_CLIENT_CHARS}}}){ACCESS_PID}{re.escape(ACCESS_DASH)}"
                 f"(?P<method>[A-Z]+) (?P<path>\\S+)"
                 f"{re.escape(ACCESS_HTTP)}(?P<http>[\\d.]+)\" (?P<status>\\d{{3}})")
_ITER = r"(?: \[\d+\])?"  # 0.5.5's `Decode batch [51341],`

# vLLM V1 (0.10+) refusing to start: `Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory
# utilization (0.9, 3.6 GiB)`; later versions name the device (`Free memory on device cuda:0 (...)`). NOTE: newer ones
# print the same start in an INFO summary of a start-up that fits (`... on startup. Desired GPU memory utilization is
# (0.975, 92.6 GiB). Actual usage is ...`, rtx6kpro#103): only "is less than" refuses
VLLM_FREE_MEMORY = r"Free memory on device (?:\S{1,40} )?\("
VLLM_FREE_MEMORY_REFUSED = VLLM_FREE_MEMORY + r"[^()]{1,40}\) on startup is less than"
# what says CUDA-graph capture began or is under way: its begin line, and its progress bars (SGLang 0.4.5+)
CAPTURE_BEGAN = ("graph_begin", "graph_progress")

STARTS: dict[str, str] = {
    # batch lines first: they are most of a log
    "decode": re.escape(DECODE_LABEL) + _ITER + f"[{LABEL_ENDS}]|{RUNNING}: \\d",
    "prefill": re.escape(PREFILL_LABEL) + _ITER + f"(?:[{LABEL_ENDS}]|\\(mixed )|{NEW_FILL_LABEL}",
    "stats": f"(?:{ENGINE})?Avg prompt throughput: ",
    "access": (re.escape(UVICORN_ACCESS.strip()) + rf"\s+\S{{1,{MAX_CLIENT_CHARS}}}" + ACCESS_PID
               + re.escape(ACCESS_DASH)),
    # SGLang start-up
    "pool": r"max_total_num_tokens?=",
    "load_begin": r"[Ll]oad weight begin",
    "load_end": r"[Ll]oad weight end",
    "kv_alloc": r"KV Cache is allocated",
    "pool_end": r"Memory pool end",
    "graph_failed": r"Capture (?:cuda|CUDA) graph failed",
    "graph_begin": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph begin",
    "graph_end": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph end",
    # NOTE: piecewise CUDA graphs (0.5.6+) are captured by token counts: `Capturing num tokens (num_tokens=3968 ...`
    "graph_progress": r"Capturing (?:batches|num tokens) \((?:(?:bs|num_tokens)=\d{1,8} )?avail_mem=",
    "dist_init": r"Init torch (?:distributed )?(?:begin|ends?)",  # 0.1: `Init torch begin. Avail mem=78.81 GB`
    "server_args": r"server_args=",
    "tokens_capped": r"max_total_tokens=-?\d+ is larger than the profiled",
    # SGLang errors
    "retract": r"[Dd]ecode out of memory happened|KV cache pool is full\. Retract requests|Testing retraction",
    "oom": r"(?:Prefill|Decode) out of memory|(?:torch\.)?(?:cuda\.)?OutOfMemoryError(?:: |\(['\"]CUDA out of memory)"
           # other devices' allocators (torch_npu: gpustack#4761), the CUDA runtime's and driver's errors
           # (sglang#4547, club-3090#60)
           r"|(?:CUDA|NPU|XPU|HIP|MUSA) out of memory|CUDA (?:driver )?[Ee]rror: out of memory"
           # torch_memory_saver re-creating what an engine released (verl's colocated rollout, sglang#14092)
           r"|(?:\[torch_memory_saver\.cpp\] )?CUresult error: 2 \(out of memory\)",
    "not_enough_memory": r"Not enought? memory|No available memory for the cache blocks|To serve at least one request "
                         r"with the models?'s max seq len|The model's max seq len \(\d+\) is larger than the maximum "
                         r"number of tokens|Failed to load model - not enough GPU memory|"
                         r"Loaded weights leave no GPU memory for the KV cache|"  # SGLang 0.5+ (InferenceX#2128)
                         # vLLM, a hybrid model: a state block per running request (retail-shopping-assistant#95)
                         r"max_num_seqs \(\d+\) exceeds available Mamba cache blocks|"
                         + VLLM_FREE_MEMORY_REFUSED,
    # NOTE: a pool or allocator names the leak (`token_to_kv_pool_allocator`, `req_to_token_pool`, 0.5's `pool`):
    # another program's `Potential memory leak detected!` is not the KV pool's
    "leak": r"(?:KV cache pool leak|[\w.]{0,80}(?:pool|allocator)\w{0,40} memory leak) detected"
            r"|Warning: available_size=|Mem Leak Detected!",  # 0.5's busy-time check (sglang#19081)
    "watchdog": r"(?:\w{1,40} )?[Ww]atchdog timeout",
    # NOTE: V0's `Error executing method ...` comes right before the traceback of the method a worker ran
    "exception": r"\w{1,40} hit an exception|Traceback \(most recent call last\)|EngineCore (?:encountered a fatal "
                 r"error|failed to start)|Engine core initialization failed"
                 r"|Error executing method \w{1,80}\. This might cause deadlock"
                 # V0's model runner, only where `execute_model` raised, before it re-raises (vllm#9342)
                 r"|Writing input of failed execution to ",
    "sigquit": r"Received sigquit",
    "engine_dead": r"MQLLMEngine is already dead",
    # NOTE: what a stop on request (Ctrl-C, SIGTERM) prints before whatever the teardown raises: vLLM 0.2x+'s
    # `[shutdown]` trigger lines (not its other `[shutdown]` lines: `engine core exited unexpectedly` is a crash's), older V1's `Shutting down FastAPI HTTP server.`, uvicorn's own `Shutting down`
    # (either engine's front end), `toolkit serve`'s `Received SIGTERM; shutting down`
    "stop": r"\[shutdown\] (?:API server: shutdown triggered|\w{1,40}: trigger received signal=)"
            r"|Shutting down FastAPI HTTP server|Received SIG(?:TERM|INT)\b|INFO:\s{1,10}Shutting down$",
    # load shedding and clients giving up (§6.4): `toolkit serve`'s lines, SGLang's disconnect wording
    "shed": r"Shed \d+ requests? (?:in the last \d+ s )?\(503",
    "queue_timeout": r"Queue timeout: aborted \d+ requests? ",
    "input_too_long": r"Input length \(\d+(?: tokens)?\) exceeds the maximum allowed length \(\d+(?: tokens)?\)",
    "client_gone": r"the client of [A-Z]{1,10} \S{1,2000} disconnected before the response"
                   r"|(?:\[http_server\] Error: )?Request is disconnected from the client side",
    # PD disaggregation: a request's KV transfer between the prefill and the decode server failed; vLLM V0's KV
    # connectors (simple, Mooncake store) on the decode side, per rank, recomputing what did not arrive
    "kv_transfer_failed": r"(?:Prefill|Decode) transfer failed for request "
                          r"|(?:\[rank\d{1,5}\]: )?Failed to receive all KVs and hidden states",
    # vLLM
    "prefix_cache": r"Prefix cache hit rate: GPU: ",
    # V0's scheduler, dropping a prompt longer than its prompt limit (the request finishes with no output)
    "prompt_too_long": r"Input prompt \(\d+ tokens\) is too long and exceeds limit of \d",
    "spec_metrics": r"SpecDecoding metrics: |Speculative metrics: ",
    "preempt": r"Sequence group \S{1,200} is preempted (?:by|in) "
               r"|Preempted request \S{1,200} has been resumed",
    "kv_capacity": r"(?:[A-Z]{2,5}(?: \+ host)? )?KV cache size: [\d,]+ tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ",
    "gpu_blocks": r"# \w{1,10} blocks: \d",
    "kv_memory": r"Available KV cache memory: ",
    "memory_profile": r"Memory profiling (?:takes|results: )|the current vLLM instance can use total_gpu_memory"
                      r"|model weights take ",
    "mm_profile": r"Starting profile run for multi-modal models",
    "weights_loaded": r"Model loading took |Loading model weights took ",
    "graph_captured": r"Graph capturing finished in ",
    "engine_config": r"Initializing an? (?:V1 )?LLM engine (?:\(v[^)]{1,40}\) )?with config: ",
    "engine_args": r"non-default args: ",
    "scheduler_config": r"Chunked prefill is enabled with max_num_batched_tokens=|max_num_scheduled_tokens is set to ",
}
# NOTE: the user's own lines pasted beside the log are read where they sit in a line (`lines.message_kind`)
NOT_ENGINE_MESSAGES = frozenset({"launch_command"})
assert set(STARTS) == set(KINDS) - NOT_ENGINE_MESSAGES, "every engine message kind has a start, every start a kind"


# -- reading ----------------------------------------------------------------------------------------------------

_MESSAGE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in STARTS.items()))
# what an error line can name: the cause of the exception it ends (each has a rule of its own)
ERROR_KINDS = frozenset({"oom", "leak", "not_enough_memory", "graph_failed"})
# An error line on its own (no traceback open): `ValueError: ...`, in backticks, or a repr `Error('...`.
ERROR_START = r"`?[\w.]{0,80}(?:Error|Exception)(?:: |\(['\"])"
_ERROR_START = re.compile(ERROR_START)
# The last line Python prints of an uncaught exception, `Name: message`, read on its own as the exception's record
# (the scheduler's traceback pasted as its error line alone, sglang#10408): the class's name ends in `Error` (some
# name before it: a bare `Error: ` is any program's message) or `Exception`; not a repr `Error('...')` (a value
# logged inside another message), not a warning
EXCEPTION_LINE = r"`?(?:[\w.]{0,80}\wError|[\w.]{0,80}Exception): \S"
_EXCEPTION_LINE = re.compile(EXCEPTION_LINE)
# NOTE: a lookahead that fails at a message `line_kind` may read as an event: one `kind_of` reads, or any error
# line (`line_kind` reads only some as events: it errs toward "maybe an event"), or a traceback's frame (the first
# line of a log that begins inside a traceback opens one)
NO_EVENT = ("(?!" + "|".join(f"(?:{pattern})" for pattern in STARTS.values()) + ")(?!" + ERROR_START + ")(?!"
            + TRACEBACK_FRAME + ")")


def kind_of(line: str, start: int = 0) -> str | None:
    """The event kind of the message starting at `start`, None when it is none of them."""
    head = line[start: start + 1]
    pattern = _BY_FIRST.get(head, _MESSAGE)
    if pattern is _UNSEEN:
        pattern = _BY_FIRST[head] = _starting_with(head)
    if pattern is None:
        return None
    m = pattern.match(line, start)
    return m.lastgroup if m is not None else None


# -- the alternation tried at a message start: only the starts that can begin with its first character --------

_UNSEEN = re.compile("")
_BY_FIRST: dict[str, re.Pattern[str] | None] = dict.fromkeys(map(chr, range(128)), _UNSEEN)  # other: _MESSAGE


def _starting_with(char: str) -> re.Pattern[str] | None:
    """`_MESSAGE` without the starts that cannot begin with `char` (in the same order, so the same match)."""
    kinds = tuple(kind for kind, first in _first_characters().items() if first is None or char in first)
    return _alternation(kinds)


@functools.lru_cache(maxsize=None)
def _alternation(kinds: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?P<{kind}>{STARTS[kind]})" for kind in kinds)) if kinds else None


@functools.lru_cache(maxsize=1)
def _first_characters() -> dict[str, frozenset[str] | None]:
    """{kind: the characters its start can begin with}, None where that is not read exactly here (a class of
    characters, a category such as `\\w`, a start that may be empty): such a start is tried at every message."""
    out: dict[str, frozenset[str] | None] = {}
    for kind, pattern in STARTS.items():
        try:
            parsed = _parser.parse(pattern)
            first, may_be_empty = _first_of_sequence(parsed)
            if parsed.state.flags & re.IGNORECASE:
                first = None
        except (AttributeError, TypeError, ValueError, re.error):  # NOTE: `re._parser` is CPython's own
            first, may_be_empty = None, True
        out[kind] = None if first is None or may_be_empty else frozenset(first)
    return out


def _first_of_sequence(items) -> tuple[set[str] | None, bool]:
    """(first characters, whether the sequence may match empty) of a parsed pattern; None: any character."""
    first: set[str] = set()
    for op, arg in items:
        chars, may_be_empty = _first_of_item(op, arg)
        if chars is None:
            return None, False
        first |= chars
        if not may_be_empty:
            return first, False
    return first, True


def _first_of_item(op, arg) -> tuple[set[str] | None, bool]:
    if op is _constants.LITERAL:
        return {chr(arg)}, False
    if op is _constants.IN and all(o in (_constants.LITERAL, _constants.RANGE) for o, _ in arg):
        ranges = [(a, a) if o is _constants.LITERAL else a for o, a in arg]
        return {chr(c) for low, high in ranges for c in range(low, high + 1)}, False
    if op is _constants.BRANCH:
        first: set[str] = set()
        empty = False
        for branch in arg[1]:
            chars, may_be_empty = _first_of_sequence(branch)
            if chars is None:
                return None, False
            first |= chars
            empty = empty or may_be_empty
        return first, empty
    if op is _constants.SUBPATTERN and not arg[1] and not arg[2]:  # a group without flags of its own
        return _first_of_sequence(arg[3])
    if op in (_constants.MAX_REPEAT, _constants.MIN_REPEAT):
        chars, may_be_empty = _first_of_sequence(arg[2])
        return chars, may_be_empty or arg[0] == 0
    return None, False


@functools.lru_cache(maxsize=None)
def _start_of(kind: str) -> re.Pattern[str]:
    return re.compile(STARTS[kind])


def start_in(kind: str, text: str) -> int | None:
    """Where a `kind` message starts anywhere in `text` (glued on after another), None where none does."""
    m = _start_of(kind).search(text)
    return m.start() if m is not None else None


def line_kind(line: str, start: int = 0) -> str | None:
    """The kind of a line that opens no record: `kind_of`, else the error kind (`ERROR_KINDS`) of an error line
    (`ValueError: No available memory ...`) read on its own, else `exception` for the last line of a Python
    exception on its own (`EXCEPTION_LINE`: a traceback whose head and frames the paste left out)."""
    kind = kind_of(line, start)
    if kind is not None:
        return kind
    m = _ERROR_START.match(line, start)
    named = kind_of(line, m.end()) if m is not None else None
    if named in ERROR_KINDS:
        return named
    return "exception" if m is not None and _EXCEPTION_LINE.match(line, start) is not None else None


# An error's class name glued to the user's words before it (`...报错ValueError: The model's max seq len ...`,
# LlamaFactory#2798): a capitalized name (`\w` takes in the letters of the label), right after a character that is
# no space, quote, backtick or bracket (prose that names an error sets it apart so: `ending in "ValueError: ..."`),
# nor a dot (`its torch.OutOfMemoryError: ...`: the name is the end of a dotted path, whose start decides)
_ERROR_GLUED = re.compile(r"(?<=[^\s\"'`(\[“‘.])[A-Z][\w.]{0,80}(?:Error|Exception)(?:: |\(['\"])")
# A message right after a bracketed field that ends a logger's own prefix, in a format no `FORMS` entry reads
# (Xinference's `2025-04-12 21:57:39,467 xinference.api.restful_api 1 ERROR    [address=..., pid=167] The model's
# max seq len ...`, xinference#3237)
_AFTER_BRACKET = re.compile(r"(?<=\] )(?=[A-Z])")


def error_in_text(line: str, start: int = 0) -> int | None:
    """Where an error line that names its cause (`ERROR_KINDS`: an OOM, a leak, no memory for the KV cache, a
    failed graph capture) starts after other text on the line: glued to it (the user's label before the paste), or
    after a logger's bracketed field; or None. Only those kinds: their words say what happened, where any other
    `...Error: ` may be a word of the label."""
    glued = _ERROR_GLUED.finditer(line, start + 1) if "Error" in line or "Exception" in line else ()
    bracketed = _AFTER_BRACKET.finditer(line, start + 1) if "] " in line else ()
    for m in (*glued, *bracketed):
        if line_kind(line, m.start()) in ERROR_KINDS:
            return m.start()
    return None


def lone_exception(line: str, start: int = 0) -> bool:
    """Whether the message at `start` is an exception's last line on its own (`line_kind` reads it as `exception`
    by `EXCEPTION_LINE`), not a message that opens an exception record."""
    return kind_of(line, start) is None and line_kind(line, start) == "exception"
