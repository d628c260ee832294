"""Renders SGLang log lines of every era (docs/log-formats.md §1-§6) from known values, and whole scenario logs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

ERAS = ("0.1.14", "0.2.5", "0.2.15", "0.3.6", "0.4.3", "0.4.9", "0.5.3", "0.5.5", "0.5.23")
T0 = 1762833987.0  # 2025-11-11 04:06:27 UTC


def _v(era: str) -> tuple[int, ...]:
    return tuple(int(x) for x in era.split("."))


@dataclass(frozen=True)
class Rank:
    tp: int = 0
    dp: int | None = None
    tp_size: int = 1
    pp: int | None = None
    ep: int | None = None


def prefix(era: str, t: float, rank: Rank = Rank(), ms: bool = False, scheduler: bool = True) -> str:
    """The logger prefix of `era` (docs/log-formats.md §1); the 0.2.5 `[gpu_id=N]` tag is added by the templates."""
    v = _v(era)
    if v < (0, 2, 15):
        return ""
    if v < (0, 3, 6):
        return f"[{time.strftime('%H:%M:%S', time.gmtime(t))} TP{rank.tp}] "
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + (f".{int(t * 1000) % 1000:03d}" if ms else "")
    if not scheduler:
        return f"[{stamp}] "
    if v < (0, 4, 9):
        tags = (f" DP{rank.dp}" if rank.dp is not None else "") + f" TP{rank.tp}"
    else:
        tags = f" DP{rank.dp}" if rank.dp is not None else ""
        tags += f" PP{rank.pp}" if rank.pp is not None else ""
        tags += f" TP{rank.tp}" if rank.tp_size > 1 else ""
        tags += f" EP{rank.ep}" if rank.ep is not None else ""
    return f"[{stamp}{tags}] "


def _gpu(era: str, rank: Rank) -> str:
    return f"[gpu_id={rank.tp}] " if era == "0.2.5" else ""


def decode(era: str, *, running: int, token: int, usage: float, throughput: float, queue: int,
           graph: bool = True, it: int | None = None) -> str:
    v = _v(era)
    if v < (0, 2, 5):
        return f"#running-req: {running}, #token: {token}, token usage: {usage:.2f}, #queue-req: {queue}"
    head = f"#running-req: {running}, #token: {token}, token usage: {usage:.2f}, "
    g = f"cuda graph: {graph}, " if v >= (0, 4, 9) else ""
    tail = f"{g}gen throughput (token/s): {throughput:.2f}, #queue-req: {queue}"
    if v < (0, 5, 5):
        return f"Decode batch. {head}{tail}" + (", " if v >= (0, 5, 3) else "")
    iters = f" [{it}]" if it is not None else ""
    return f"Decode batch{iters}, {head}{tail}" + (", " if v < (0, 5, 23) else "")


def prefill(era: str, *, new_seq: int, new_token: int, cached: int, running: int, queue: int,
            usage: float = 0.0, token: int = 0, hit_rate: float = 0.0, pending: int = 0,
            throughput: float = 0.0, graph: bool = False, mixed: int | None = None, it: int | None = None) -> str:
    v = _v(era)
    if v < (0, 2, 5):
        return (f"new fill batch. #seq: {new_seq}. #cached_token: {cached}. #new_token: {new_token}. "
                f"#remaining_req: {queue}. #running_req: {running}. tree_cache_hit_rate: {100 * hit_rate:.2f}%.")
    seqs = f"#new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached}, "
    tail = f"#running-req: {running}, #queue-req: {queue}"
    if v < (0, 3, 6):
        label = f"Prefill batch(mixed #running-req: {mixed})." if mixed is not None else "Prefill batch."
        return f"{label} {seqs}cache hit rate: {100 * hit_rate:.2f}%, {tail}"
    if v < (0, 4, 9):
        return f"Prefill batch. {seqs}cache hit rate: {100 * hit_rate:.2f}%, token usage: {usage:.2f}, {tail}"
    if v < (0, 5, 3):
        return f"Prefill batch. {seqs}#token: {token}, token usage: {usage:.2f}, {tail}"
    if v < (0, 5, 5):
        return f"Prefill batch. {seqs}token usage: {usage:.2f}, {tail}, "
    iters = f" [{it}]" if it is not None else ""
    if v < (0, 5, 23):
        return f"Prefill batch{iters}, {seqs}token usage: {usage:.2f}, {tail}, "
    return (f"Prefill batch{iters}, {seqs}#token: {token}, token usage: {usage:.2f}, {tail}, "
            f"#pending-token: {pending}, cuda graph: {graph}, input throughput (token/s): {throughput:.2f}")


def retract(era: str, *, k: int, old: float, new: float, aborted: int = 0, gained: int = 0) -> str:
    v = _v(era)
    ratio = f"#new_token_ratio: {old:.4f} -> {new:.4f}"
    if v < (0, 2, 5):
        return f"decode out of memory happened, #retracted_reqs: {k}, {ratio}"
    if v < (0, 4, 9):
        return f"Decode out of memory happened. #retracted_reqs: {k}, {ratio}"
    head = f"KV cache pool is full. Retract requests. #retracted_reqs: {k}, "
    if era == "0.5.3":
        return f"{head}#aborted_retracted_reqs: {aborted}, {ratio}"
    if v >= (0, 5, 23):
        return f"{head}#new_tokens_gained: {gained}, {ratio}"
    return head + ratio


@dataclass(frozen=True)
class Startup:
    max_total: int = 665690
    chunk: int = 8192
    max_prefill: int = 16384
    max_running: int = 4096
    context_len: int = 65536
    available: float = 6.5
    gpu_mem: float = 78.5
    weights: float = 15.1
    kv_gb: float = 40.63
    graph_mem: float = 0.81
    device: str = "gpu"


def startup(era: str, s: Startup = Startup(), tp: int = 0) -> list[str]:
    """Load weight, KV pool, graph capture and the max_total_num_tokens line, in the era's forms."""
    v = _v(era)
    if v < (0, 2, 5):
        return [f"Rank {tp}: load weight begin.", f"Rank {tp}: load weight end.",
                f"Rank {tp}: max_total_num_token={s.max_total}, max_prefill_num_token={s.max_prefill}, "
                f"context_len={s.context_len}, "]
    after = s.gpu_mem - s.weights
    usage = f", mem usage={s.weights:.2f} GB" if v >= (0, 4, 9) else ""
    lines = [f"Load weight begin. avail mem={s.gpu_mem:.2f} GB",
             f"Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={after:.2f} GB{usage}."]
    if v >= (0, 4, 9):
        lines.append(f"KV Cache is allocated. #tokens: {s.max_total}, K size: {s.kv_gb / 2:.2f} GB, "
                     f"V size: {s.kv_gb / 2:.2f} GB")
    elif v >= (0, 4, 3):
        lines.append(f"KV Cache is allocated. K size: {s.kv_gb / 2:.2f} GB, V size: {s.kv_gb / 2:.2f} GB.")
    pool_avail = s.available + s.graph_mem
    lines.append(f"Memory pool end. avail mem={pool_avail:.2f} GB")
    if v >= (0, 4, 9):
        lines.append(f"Capture cuda graph begin. This can take up to several minutes. avail mem={pool_avail:.2f} GB")
        lines.append(f"Capture cuda graph end. Time elapsed: 12.34 s. mem usage={s.graph_mem:.2f} GB. "
                     f"avail mem={s.available:.2f} GB.")
    elif v >= (0, 4, 3):
        lines.append("Capture cuda graph begin. This can take up to several minutes.")
        lines.append("Capture cuda graph end. Time elapsed: 12.34 s")
    key = "available_cpu_mem" if s.device == "cpu" else "available_gpu_mem"
    if v >= (0, 4, 9):
        lines.append(f"max_total_num_tokens={s.max_total}, chunked_prefill_size={s.chunk}, "
                     f"max_prefill_tokens={s.max_prefill}, max_running_requests={s.max_running}, "
                     f"context_len={s.context_len}, {key}={s.available:.2f} GB")
    elif v >= (0, 4, 3):
        lines.append(f"max_total_num_tokens={s.max_total}, chunked_prefill_size={s.chunk}, "
                     f"max_prefill_tokens={s.max_prefill}, max_running_requests={s.max_running}, "
                     f"context_len={s.context_len}")
    else:
        lines.append(f"max_total_num_tokens={s.max_total}, max_prefill_tokens={s.max_prefill}, "
                     f"max_running_requests={s.max_running}, context_len={s.context_len}")
    return lines


def server_args(**args: object) -> str:
    body = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return f"server_args=ServerArgs({body})"


def oom_block(phase: str, requested: int, available: int, evictable: int) -> list[str]:
    label = "Prefill" if phase == "prefill" else "Decode"
    return [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2345, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        f"RuntimeError: {label} out of memory. Try to lower your batch size.",
        f"Try to allocate {requested} tokens.",
        f"Available tokens: {available + evictable}",
        f"self.token_to_kv_pool_allocator.available_size()={available}",
        f"self.tree_cache.evictable_size()={evictable}",
        "",
    ]


def scheduler_traceback(loop: str = "event_loop_overlap", error: str = "RuntimeError: CUDA error: an illegal memory "
                        "access was encountered", *, frames: tuple[str, ...] = ()) -> str:
    """SGLang's scheduler crash, raised inside `loop` (`event_loop_overlap` or `event_loop_normal`) and `frames`."""
    src = "/sgl-workspace/sglang/python/sglang/srt/managers"
    lines = ["Scheduler hit an exception: Traceback (most recent call last):",
             f'  File "{src}/scheduler.py", line 2345, in run_scheduler_process', f"    scheduler.{loop}()",
             f'  File "{src}/scheduler.py", line 812, in {loop}', "    self.process_batch_result(batch, result)"]
    for frame in frames:
        lines += [f'  File "{src}/tp_worker_overlap_thread.py", line 150, in {frame}', "    copy_done.synchronize()"]
    return "\n".join([*lines, error])


def pd_tp_error(message: str = "PD Disaggregation does NOT support PD different TP sizes for non-MLA hybrid models "
                "yet.") -> str:
    """A PD-disaggregation KV transfer raising on prefill and decode servers of different TP sizes."""
    return "\n".join(["Scheduler hit an exception: Traceback (most recent call last):",
                      '  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/mooncake/conn.py", line 901, '
                      "in transfer_worker", "    raise RuntimeError(", f"RuntimeError: {message}"])


def watchdog(era: str, timeout: int = 300) -> str:
    if _v(era) >= (0, 5, 23):
        return f"Scheduler watchdog timeout (self.watchdog_timeout={timeout}, self.soft=False)"
    return f"Watchdog timeout (self.watchdog_timeout={timeout})"


def shed(first: bool = False, every: float = 10.0, **reasons: int) -> str:
    """`toolkit serve`'s shed summary (docs/log-formats.md §6.4), written by the runtime's own `ShedLog`: the first
    line of a run, or one `every` seconds after the one before."""
    from toolkit.runtime.server.admission import ShedLog

    log = ShedLog(interval=0.0)
    log.pending.update(reasons)
    if not first:
        log.last_line = 0.0
    line = log.flush(now=0.0 if first else every)
    assert line is not None
    return line


# NOTE: the scheduler's and the HTTP server's lines are f-strings inside their handlers; tests/diagnose/test_shedding.py
# checks that the runtime's source still writes these words.
QUEUE_TIMEOUT = "Queue timeout: aborted {n} requests that waited more than {limit:g} s, #queue-req: {queue}"
CLIENT_GONE = "the client of {method} {path} disconnected before the response"
SGLANG_CLIENT_GONE = ("[http_server] Error: Request is disconnected from the client side (type 1). "
                      "Abort request obj.rid='{rid}'")


def queue_timeout(n: int, limit: float = 5.0, queue: int = 0) -> str:
    return QUEUE_TIMEOUT.format(n=n, limit=limit, queue=queue)


def client_gone(method: str = "POST", path: str = "/v1/chat/completions") -> str:
    return CLIENT_GONE.format(method=method, path=path)


def access(path: str = "/v1/chat/completions", status: int = 200, port: int = 54321) -> str:
    return f'INFO:     127.0.0.1:{port} - "POST {path} HTTP/1.1" {status} OK'


# -- scenarios ---------------------------------------------------------------------------------------

@dataclass
class Log:
    """A log under construction: `add(t, message)` stamps a scheduler line in the era's format."""

    era: str = "0.4.9"
    rank: Rank = field(default_factory=Rank)
    lines: list[str] = field(default_factory=list)
    t: float = T0

    def add(self, message: str, *, dt: float = 0.0, scheduler: bool = True, rank: Rank | None = None) -> Log:
        self.t += dt
        r = rank or self.rank
        for i, part in enumerate(message.split("\n")):
            if i == 0:
                self.lines.append(prefix(self.era, self.t, r, scheduler=scheduler) + (_gpu(self.era, r) if scheduler else '') + part)
            else:
                self.lines.append(part)
        return self

    def start(self, s: Startup = Startup(), **args: object) -> Log:
        if args:
            self.add(server_args(**args), scheduler=False)
        for line in startup(self.era, s, self.rank.tp):
            self.add(line)
        return self

    def decode_series(self, n: int, *, every: float = 2.0, running: int | list[int] = 100,
                      queue: int | list[int] = 0, usage: float | list[float] = 0.5, throughput: float | list[float] = 3000.0,
                      graph: bool | list[bool] = True, max_total: int = 665690) -> Log:
        def pick(x, i):
            return x[i % len(x)] if isinstance(x, list) else x
        for i in range(n):
            u = pick(usage, i)
            self.add(decode(self.era, running=pick(running, i), token=int(u * max_total), usage=u,
                            throughput=pick(throughput, i), queue=pick(queue, i), graph=pick(graph, i)), dt=every)
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# -- vLLM (docs/log-formats.md §9) ---------------------------------------------------------------------

def vllm_prefix(t: float, process: str = "APIServer", pid: int = 20584, file: str = "loggers.py:335",
                level: str = "INFO") -> str:
    return f"({process} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S', time.gmtime(t))} [{file}] "


def vllm_stats(*, running: int, waiting: int, usage: float, gen: float, prompt: float = 100.0, engine: int = 0,
               preemptions: int = 0, hit: float = 0.0, device: str = "GPU") -> str:
    pre = f"Preemptions: {preemptions}, " if preemptions else ""
    return (f"Engine {engine:03d}: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: "
            f"{gen:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, {pre}{device} KV cache usage: "
            f"{100 * usage:.1f}%, Prefix cache hit rate: {100 * hit:.1f}%")


def vllm_engine_traceback(*frames: tuple[str, str], error: str = "AssertionError") -> list[str]:
    """vLLM V1's engine-core crash through `frames` ((file under vllm/v1, function)), as its own lines."""
    src = "/usr/local/lib/python3.12/dist-packages/vllm/v1"
    lines = ["EngineCore encountered a fatal error.", "Traceback (most recent call last):",
             f'  File "{src}/engine/core.py", line 701, in run_engine_core', "    engine_core.run_busy_loop()"]
    for file, function in frames:
        lines += [f'  File "{src}/{file}", line 400, in {function}', "    outputs = self.step_fn()"]
    return [*lines, error]


def vllm_resumed(request: str) -> str:
    """V1's scheduler line when a preempted request comes back (one per preemption)."""
    return f"Preempted request {request} has been resumed!"


@dataclass
class VllmLog:
    """A vLLM V1 log under construction: start-up lines, then one stats line every `every` seconds."""

    lines: list[str] = field(default_factory=list)
    t: float = T0

    def add(self, message: str, *, dt: float = 0.0, **prefix: object) -> VllmLog:
        self.t += dt
        self.lines.append(vllm_prefix(self.t, **prefix) + message)  # type: ignore[arg-type]
        return self

    def start(self, *, kv_tokens: int = 447088, max_model_len: int = 32768, tp: int = 1, max_num_seqs: int | None = None,
              gpu_memory_utilization: float | None = None, graph_gb: float = 0.33, kv_gb: float = 54.62,
              enforce_eager: bool = False, capture: int = 512,
              num_gpu_blocks_override: int | None = None) -> VllmLog:
        args = {"model": "Qwen/Qwen3-8B"}
        if max_num_seqs is not None:
            args["max_num_seqs"] = max_num_seqs
        if num_gpu_blocks_override is not None:
            args["num_gpu_blocks_override"] = num_gpu_blocks_override
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        self.add(f"non-default args: {args!r}", file="utils.py:233")
        core = {"process": "EngineCore_DP0", "pid": 20600}
        self.add(f"Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', "
                 f"speculative_config=None, dtype=torch.bfloat16, max_seq_len={max_model_len}, "
                 f"tensor_parallel_size={tp}, pipeline_parallel_size=1, data_parallel_size=1, quantization=None, "
                 f"enforce_eager={enforce_eager}, kv_cache_dtype=auto, enable_prefix_caching=True, "
                 f"compilation_config={{'level': 3, 'max_cudagraph_capture_size': {capture}}}", dt=1,
                 file="core.py:134", **core)
        self.add("Model loading took 15.2640 GiB and 8.120000 seconds", dt=5, file="gpu_model_runner.py:5150", **core)
        self.add(f"Available KV cache memory: {kv_gb:.2f} GiB", dt=5, file="gpu_worker.py:760", **core)
        self.add(f"GPU KV cache size: {kv_tokens:,} tokens, Maximum concurrency for {max_model_len:,} tokens per "
                 f"request: {kv_tokens / max_model_len:.2f}x", file="kv_cache_utils.py:1234", **core)
        self.add(f"Graph capturing finished in 13 secs, took {graph_gb:.2f} GiB", dt=13,
                 file="gpu_model_runner.py:6582", **core)
        return self

    def stats_series(self, n: int, every: float = 10.0, **kw: object) -> VllmLog:
        def pick(x, i):
            return x[i % len(x)] if isinstance(x, list) else x
        for i in range(n):
            self.add(vllm_stats(**{k: pick(v, i) for k, v in kw.items()}), dt=every)  # type: ignore[arg-type]
        return self
