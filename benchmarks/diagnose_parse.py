"""Diagnose speed and memory as the user sees them, side by side with SGLang's own log parser, on one generated log.

    python -m benchmarks.diagnose_parse [--lines N] [--runs R] [--mix realistic|templates] [--modes a,b]
                                        [--sglang-parser FILE --sglang-path DIR] [--save]

Writes an N-line (default 1,000,000) log to a temporary file. `--mix realistic` (the default) is what a user's
log holds: segments written one after another, each with its start-up block (server_args, weights, KV pool, graph
capture, uvicorn's start), then its steady state, and one multi-line traceback. By lines:
  SGLang, 90%: six segments, one per prefix, of equal length: plain stamps of 0.4.9 (`[ts TP0..TP3]`,
            `Decode batch.`), plain stamps of 0.5.5 (`[ts DP0..DP3 TP0]`, `Decode batch,`), docker compose
            `sglang-1  | `, CRI `2025-...Z stdout F `, Ray `(SGLangEngine pid=N) `, journald `Nov 11 04:06:27
            host python[N]: ` (the last four over 0.5.5 lines); within a segment's steady state: 55% decode, 15% prefill, 20% uvicorn access lines, 8% other
            INFO lines (request receipts, cache flushes, health checks), 2% WARNING lines;
  vLLM V1, 10%: one segment, `(APIServer pid=1)` and `(EngineCore_DP0 pid=N)` prefixes, its start-up block,
            then 80% access lines, 15% `Added request` lines, 5% `Engine 000:` stats lines;
  about 0.2% start-up and traceback lines in all. The segments' clocks run on, 50 lines a second.
`--mix templates` is the earlier log of five templates (50% decode, 25% prefill, 25% access; all read by the
fast path). Then measures, each in a fresh process, lines/s (wall clock), CPU seconds and peak RSS, the
fastest of R runs (the machine is shared: the fastest run is the least disturbed; CPU seconds, which a busy
machine disturbs less, are recorded too: `lines_per_cpu_s`, all processes of the command together):
  command   the whole command as a user runs it: `toolkit diagnose LOG > /dev/null` (start-up included);
  export    `toolkit diagnose LOG --export events.csv` (every event streamed out as CSV);
  analyze   `toolkit.diagnose.analyze([LOG])` in a process that has imported it (no start-up);
  scan      the fast path alone: every chunk scanned, one thread;
  sglang    SGLang's `log_parser.parse(text)` (python/sglang/srt/debug_utils/log_parser.py, polars), from a
            copy of the file given with --sglang-parser and polars importable from --sglang-path;
  sglang-ray  that parser's own pattern (`_PATTERN_DECODE`) through polars `str.extract_groups`, rows with a
            throughput kept, on a copy of the log with Ray's `(SGLangEngine pid=N) ` before every line: the
            form the pattern is written for (on plain SGLang lines it needs whitespace before the `[` stamp and
            matches nothing; parse() itself then stops at its Int64 cast of `token usage`, so this mode times
            its extraction without that cast).
Peak RSS of `command` and `export` is that of the whole process tree: the sum of the RSS of the command's process
and all its descendants (the fast path's workers), sampled every ~5 ms, its maximum (`peak_rss_mb`); with each
process's own peak (`VmHWM`, `process_peaks_mb`) and the largest one by `getrusage` (`largest_process_rss_mb`).
The in-process modes report their one process's peak. CPU seconds are those of every process of the command.
Both builds run as installed: ours is compiled to bytecode first, as pip compiles the baseline's build.
It prints one line per mode, the issue's targets (command >= 1M lines/s, peak RSS of all processes < 300 MiB,
export >= 500k lines/s) met or not, and the ratio of ours to SGLang's (lines/s, same file, same run); --save
writes the results with the command, commit, CPU model and date (`benchmarks.common.write_result`).
"""
from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import cpu_model, provenance, write_result

_ERAS = (
    ("[{ts} TP0] Decode batch. #running-req: {r}, #token: {tok}, token usage: {u:.2f}, gen throughput (token/s): "
     "{g:.2f}, #queue-req: {q}"),
    ("[{ts} TP0] Decode batch. #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
     "gen throughput (token/s): {g:.2f}, #queue-req: {q}"),
    ("[{ts} DP1 TP1] Decode batch, #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
     "gen throughput (token/s): {g:.2f}, #queue-req: {q}, "),
)
_PREFILL = (
    ("[{ts} TP0] Prefill batch. #new-seq: 2, #new-token: {n}, #cached-token: {c}, cache hit rate: 12.50%, "
     "token usage: {u:.2f}, #running-req: {r}, #queue-req: {q}"),
    ("[{ts} DP1 TP1] Prefill batch, #new-seq: 2, #new-token: {n}, #cached-token: {c}, token usage: {u:.2f}, "
     "#running-req: {r}, #queue-req: {q}, "),
)
_ACCESS = '[{ts}] INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK'


RAY_PREFIX = "(SGLangEngine pid=4242) "
MIX = ("SGLang 90%: 6 segments (plain 0.4.9 TP0-3, plain 0.5.5 DP0-3, compose, CRI, Ray, journald), each 55% decode, "
       "15% prefill, 20% access, 8% other INFO, 2% WARNING, a start-up block and a traceback; vLLM V1 10%: 80% "
       "access, 15% Added request, 5% stats")


def write_log(path: str, n: int, seed: int = 0, prefix: str = "", mix: str = "templates") -> None:
    """An n-line log of `mix` (module docstring), every line after `prefix`."""
    rng = random.Random(seed)
    lines = _templates(rng, n) if mix == "templates" else _realistic(rng, n)
    with open(path, "w") as f:
        f.writelines(prefix + line + "\n" for line in lines)


def _templates(rng: random.Random, n: int):
    t0 = 1762833987
    for i in range(n):
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + i // 50))
        x = rng.random()
        r, q, u = rng.randint(1, 300), rng.randint(0, 500), rng.random()
        if x < 0.5:
            yield rng.choice(_ERAS).format(ts=ts, r=r, tok=int(u * 6e5), u=u, g=rng.random() * 5e3, q=q)
        elif x < 0.75:
            yield rng.choice(_PREFILL).format(ts=ts, n=rng.randint(1, 8192), c=rng.randint(0, 8192), u=u, r=r, q=q)
        else:
            yield _ACCESS.format(ts=ts, port=rng.randint(1024, 65535))


# -- the realistic mix ----------------------------------------------------------------------------------------

_SG_STARTUP = (
    "server_args=ServerArgs(model_path='meta-llama/Llama-3.1-70B-Instruct', tp_size=4, dp_size={dp}, "
    "mem_fraction_static=0.85, chunked_prefill_size=8192, schedule_policy='fcfs', cuda_graph_max_bs=256)",
    "Init torch distributed begin.", "Init torch distributed ends. mem usage=1.02 GB",
    "Load weight begin. avail mem=78.50 GB",
    "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=43.40 GB, mem usage=35.10 GB.",
    "KV Cache is allocated. #tokens: 665690, K size: 10.16 GB, V size: 10.16 GB",
    "Memory pool end. avail mem=21.90 GB",
    "Capture cuda graph begin. This can take up to several minutes. avail mem=21.10 GB",
    "Capture cuda graph end. Time elapsed: 12.34 s. mem usage=0.81 GB. avail mem=20.29 GB.",
    "max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, "
    "context_len=131072, available_gpu_mem=20.29 GB",
    "INFO:     Started server process [{pid}]", "INFO:     Waiting for application startup.",
    "INFO:     Application startup complete.", "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
    "The server is fired up and ready to roll!",
)
_SG_OTHER = (
    "Receive: obj=GenerateReqInput(rid='{rid}', text=None, input_ids=None, stream=True, log_metrics=True)",
    "Cache flushed successfully!", "INFO:     127.0.0.1:{port} - \"GET /health HTTP/1.1\" 200 OK",
    "Finish: obj=GenerateReqInput(rid='{rid}'), out={{'meta_info': {{'prompt_tokens': 812, 'completion_tokens': 256}}}}",
)
_SG_WARNINGS = (
    "WARNING: Request {rid} exceeds the context length; it is truncated to 131072 tokens.",
    "WARNING: Prefill out of memory. Try to lower your batch size.",
    "Scheduler hit a long stall: 1.23 s since the last batch",
)
_TRACEBACK = (
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2651, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    '  File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 116, in decorate_context',
    "    return func(*args, **kwargs)",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 832, in event_loop_overlap',
    "    batch = self.get_next_batch_to_run()",
    "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
)
_DECODE_04 = ("Decode batch. #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
              "gen throughput (token/s): {g:.2f}, #queue-req: {q}")
_DECODE_05 = ("Decode batch, #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
              "gen throughput (token/s): {g:.2f}, #queue-req: {q}, ")
_PREFILL_04 = ("Prefill batch. #new-seq: {s}, #new-token: {n}, #cached-token: {c}, token usage: {u:.2f}, "
               "#running-req: {r}, #queue-req: {q}")
_PREFILL_05 = ("Prefill batch, #new-seq: {s}, #new-token: {n}, #cached-token: {c}, token usage: {u:.2f}, "
               "#running-req: {r}, #queue-req: {q}, ")
_ACCESS_MESSAGE = 'INFO:     10.0.{a}.{b}:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
_SG_SEGMENTS = (  # (line prefix before the stamp, rank tags, decode, prefill)
    ("", (" TP0", " TP1", " TP2", " TP3"), _DECODE_04, _PREFILL_04),
    ("", (" DP0 TP0", " DP1 TP0", " DP2 TP0", " DP3 TP0"), _DECODE_05, _PREFILL_05),
    ("sglang-1  | ", (" DP0 TP0", " DP1 TP0"), _DECODE_05, _PREFILL_05),
    ("{iso} stdout F ", (" TP0",), _DECODE_05, _PREFILL_05),
    ("(SGLangEngine pid=4242) ", (" TP0", " TP1"), _DECODE_05, _PREFILL_05),
    ("{syslog} gpu-node-1 python[4242]: ", ("",), _DECODE_05, _PREFILL_05),
)
_VLLM_STARTUP = (
    ("APIServer", "INFO", "api_server.py:1885", "vLLM API server version 0.11.0"),
    ("APIServer", "INFO", "utils.py:233", "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_num_seqs': 256}"),
    ("EngineCore_DP0", "INFO", "core.py:77", "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B'"),
    ("EngineCore_DP0", "INFO", "gpu_model_runner.py:2653", "Model loading took 15.2683 GiB and 4.521 seconds"),
    ("EngineCore_DP0", "INFO", "gpu_worker.py:298", "Available KV cache memory: 54.62 GiB"),
    ("EngineCore_DP0", "INFO", "kv_cache_utils.py:1087", "GPU KV cache size: 447,088 tokens"),
    ("EngineCore_DP0", "INFO", "kv_cache_utils.py:1091", "Maximum concurrency for 32,768 tokens per request: 13.64x"),
    ("EngineCore_DP0", "INFO", "gpu_model_runner.py:3480", "Graph capturing finished in 12 secs, took 0.33 GiB"),
    ("APIServer", "WARNING", "config.py:1371", "Default sampling parameters have been overridden by the model's "
                                               "Hugging Face generation config."),
)


def _realistic(rng: random.Random, n: int):
    """The lines of `--mix realistic` (module docstring), n of them."""
    t0, written = 1762833987.0, 0
    shares = [0.15] * len(_SG_SEGMENTS) + [0.10]
    for k, share in enumerate(shares):
        count = n - written if k == len(shares) - 1 else int(n * share)
        segment = _vllm_segment if k == len(_SG_SEGMENTS) else _sglang_segment
        for line in segment(rng, count, t0 + written / 50, k):
            yield line
        written += count


def _sglang_segment(rng: random.Random, count: int, t0: float, k: int):
    outer, tags, decode, prefill = _SG_SEGMENTS[k]
    startup = [s.format(dp=len(tags), pid=1000 + k) for s in _SG_STARTUP]
    crash_at = count // 2
    for i in range(count):
        t = t0 + i / 50
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
        head = outer.format(iso=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e9) % 10**9:09d}Z",
                            syslog=time.strftime("%b %d %H:%M:%S", time.gmtime(t)))
        if i < len(startup):
            yield f"{head}[{stamp}{tags[0]}] {startup[i]}"
            continue
        if crash_at <= i < crash_at + len(_TRACEBACK):
            part = _TRACEBACK[i - crash_at]
            yield f"{head}[{stamp}{tags[0]}] {part}" if i == crash_at else head + part
            continue
        x, tag = rng.random(), rng.choice(tags)
        r, q, u = rng.randint(1, 300), rng.choice((0, 0, 0, rng.randint(1, 50))), rng.random()
        if x < 0.55:
            message = decode.format(r=r, tok=int(u * 665690), u=u, g=rng.random() * 5e3, q=q)
        elif x < 0.70:
            message = prefill.format(s=rng.randint(1, 8), n=rng.randint(1, 8192), c=rng.randint(0, 8192), u=u, r=r,
                                     q=q)
        elif x < 0.90:
            message, tag = _ACCESS_MESSAGE.format(a=rng.randint(0, 255), b=rng.randint(1, 254),
                                                  port=rng.randint(1024, 65535)), ""
        elif x < 0.98:
            message = rng.choice(_SG_OTHER).format(rid=f"{rng.getrandbits(64):016x}", port=rng.randint(1024, 65535))
            tag = "" if "INFO:" in message else tag
        else:
            message = rng.choice(_SG_WARNINGS).format(rid=f"{rng.getrandbits(64):016x}")
        yield f"{head}[{stamp}{tag}] {message}"


def _vllm_segment(rng: random.Random, count: int, t0: float, k: int):
    for i in range(count):
        t = t0 + i / 50
        stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(t))
        if i < len(_VLLM_STARTUP):
            process, level, where, message = _VLLM_STARTUP[i]
            pid = 1 if process == "APIServer" else 312
            yield f"({process} pid={pid}) {level} {stamp} [{where}] {message}"
            continue
        x = rng.random()
        if x < 0.80:
            yield f"(APIServer pid=1) " + _ACCESS_MESSAGE.format(a=rng.randint(0, 255), b=rng.randint(1, 254),
                                                                 port=rng.randint(1024, 65535))
        elif x < 0.95:
            yield f"(APIServer pid=1) INFO {stamp} [async_llm.py:318] Added request chatcmpl-{rng.getrandbits(64):016x}."
        else:
            r, w, u = rng.randint(1, 256), rng.choice((0, 0, rng.randint(1, 40))), rng.random()
            yield (f"(APIServer pid=1) INFO {stamp} [loggers.py:123] Engine 000: Avg prompt throughput: "
                   f"{rng.random() * 2e4:.1f} tokens/s, Avg generation throughput: {rng.random() * 3e3:.1f} tokens/s, "
                   f"Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {100 * u:.1f}%, "
                   f"Prefix cache hit rate: {rng.random() * 60:.1f}%")


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _analyze(path: str) -> dict:
    from toolkit.diagnose import analyze

    start, cpu = time.perf_counter(), time.process_time() + _children_cpu()
    d = analyze([path])
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() + _children_cpu() - cpu,
            "events": sum(d.stats.kinds.values()), "verdict": d.verdict}


def _children_cpu() -> float:
    """CPU seconds of the worker processes that have ended (the fast path's process pool)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _scan(path: str) -> dict:
    from toolkit.diagnose.read.fastpath.scan import scan_chunk
    from toolkit.diagnose.read.source import LineReader, open_log

    start, cpu, events = time.perf_counter(), time.process_time(), 0
    with open_log(path) as stream:
        for chunk in LineReader(stream).chunks():
            scanned = scan_chunk(chunk.data, chunk.size)
            events += len(scanned.batch.index) + scanned.access
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": events}


def _sglang(path: str, parser_file: str) -> dict:
    spec = importlib.util.spec_from_file_location("sglang_log_parser", parser_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    import polars  # noqa: F401 - imported before the clock starts (parse() imports it on first call)

    start, cpu = time.perf_counter(), time.process_time()
    with open(path) as f:
        df = module.parse(f.read())
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": df.height}


def _sglang_ray(path: str, parser_file: str) -> dict:
    spec = importlib.util.spec_from_file_location("sglang_log_parser", parser_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    import polars as pl

    ray = path + ".ray"
    with open(path) as src, open(ray, "w") as dst:
        dst.writelines(RAY_PREFIX + line for line in src)
    start, cpu = time.perf_counter(), time.process_time()
    with open(ray) as f:
        frame = pl.DataFrame({"line": f.read().splitlines()})
    rows = frame.select(pl.col("line").str.extract_groups(module._PATTERN_DECODE).alias("info")).unnest("info")
    rows = rows.filter(pl.col("throughput").is_not_null())
    result = {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": rows.height}
    os.unlink(ray)
    return result


class _TreeMemory:
    """Peak RSS of a process and all its descendants: their RSS summed at each sample, its maximum; and each
    process's own peak (`VmHWM` of /proc/PID/status, Linux; its largest sampled RSS elsewhere). Cheap, as it
    shares the command's cores: each sample reads one line per process (/proc/PID/statm); the tree is listed
    again every `REFRESH` samples, and a process's peak read then and whenever its RSS passes the largest seen."""

    REFRESH = 10

    def __init__(self, pid: int) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.processes = [self.root]
        self.peak = 0
        self.own: dict[int, tuple[str, int]] = {}
        self.samples = 0

    def sample(self) -> None:
        import psutil

        refresh = self.samples % self.REFRESH == 0
        if refresh:
            try:
                self.processes = [self.root, *_descendants(self.root)]
            except psutil.Error:
                pass
        self.samples += 1
        total = 0
        for process in self.processes:
            rss = _rss(process)
            total += rss
            name, seen = self.own.get(process.pid, (None, 0))
            if refresh or name is None or rss > seen:  # NOTE: a process may exit before the next refresh
                seen = max(seen, _hwm(process) or rss)
                name = name or _name(process)
            self.own[process.pid] = (name, max(seen, rss))
        self.peak = max(self.peak, total)

    def process_peaks_mb(self) -> dict[str, float]:
        return {f"{name} {pid}": round(peak / 2**20, 1) for pid, (name, peak) in self.own.items() if peak}


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _descendants(root) -> list:
    """The processes under `root`: from /proc/PID/stat's parent field of the processes started after it (a larger
    pid: a child whose pid wrapped past pid_max during a run is missed), a few files instead of psutil's
    read of every process; psutil's listing where there is no /proc."""
    import psutil

    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return root.children(recursive=True)
    later = [pid for pid in pids if pid > root.pid]
    parent = {}
    for pid in later:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], {root.pid}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier and pid not in found}
        found.extend(sorted(frontier))
    processes = []
    for pid in found:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return processes


def _rss(process) -> int:
    """A process's current RSS in bytes (0 once it is gone): /proc/PID/statm's second number, else psutil's."""
    try:
        with open(f"/proc/{process.pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        try:
            return process.memory_info().rss
        except Exception:
            return 0


def _hwm(process) -> int:
    """A process's peak RSS in bytes (VmHWM of /proc/PID/status); 0 where unknown."""
    try:
        with open(f"/proc/{process.pid}/status", "rb") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(b"VmHWM:"))
    except (OSError, StopIteration, IndexError, ValueError):
        return 0


def _own_peak_mb() -> float:
    """This process's peak RSS: VmHWM (getrusage's ru_maxrss carries the benchmark parent's over fork and exec)."""
    try:
        with open("/proc/self/status", "rb") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(b"VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _name(process) -> str:
    try:
        cmdline = process.cmdline()
        return " ".join(part for part in cmdline[1:3] if part)[:40] or process.name()
    except Exception:
        return "?"


def _command(argv: list[str]) -> dict:
    """Run a command (stdout to /dev/null): its wall time, the CPU time of all its processes, the peak RSS of its
    process tree (sampled every ~5 ms), each process's peak, and the largest process's by getrusage."""
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryDirectory() as empty:
        start = time.perf_counter()
        # NOTE: run in an empty folder: `-m` puts the working directory first on sys.path, so in the repository
        # `toolkit/` would shadow PYTHONPATH's, and a stray `bisect.py` in /tmp once shadowed the standard library
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=empty)
        tree = _TreeMemory(proc.pid)
        while proc.poll() is None:
            tree.sample()
            time.sleep(0.005)
        seconds = time.perf_counter() - start
        err.seek(0)
        stderr = err.read().strip()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    # NOTE: no --fail-on is given, so any exit but 0 is a failed run (a traceback exits 1)
    if proc.returncode != 0:
        raise RuntimeError(stderr.splitlines()[-1] if stderr else f"exit {proc.returncode}")
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime, "tree_rss_mb": tree.peak / 2**20,
            "largest_process_rss_mb": usage.ru_maxrss / 1024, "process_peaks_mb": tree.process_peaks_mb(),
            "samples": tree.samples}


def _child(mode: str, path: str, extra: str | None) -> None:
    if mode == "command":
        result = _command([sys.executable, "-m", "toolkit.cli", "diagnose", path])
    elif mode == "export":
        with tempfile.TemporaryDirectory() as tmp:
            result = _command([sys.executable, "-m", "toolkit.cli", "diagnose", path, "--export",
                               os.path.join(tmp, "events.csv")])
    else:
        result = {"analyze": lambda: _analyze(path), "scan": lambda: _scan(path),
                  "sglang": lambda: _sglang(path, extra or ""),
                  "sglang-ray": lambda: _sglang_ray(path, extra or "")}[mode]()
    rss = result.pop("tree_rss_mb", None)
    result["peak_rss_mb"] = rss if rss is not None else _own_peak_mb()
    result["rss_of"] = "process tree" if rss is not None else "one process"
    print(json.dumps(result))


def _run(mode: str, path: str, sglang_parser: str | None, sglang_path: str | None, site: str | None = None) -> dict:
    """One measurement in a fresh process; `site`: a directory holding another build of toolkit to run instead."""
    env = dict(os.environ)
    if mode.startswith("sglang") and sglang_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.getcwd(), sglang_path) if p)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "benchmarks.diagnose_parse", "--child", mode, path]
    if mode.startswith("sglang"):
        argv += ["--extra", sglang_parser or ""]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


MODES = {
    "command": "ours: `toolkit diagnose LOG` (whole command)",
    "export": "ours: `toolkit diagnose LOG --export x.csv`",
    "analyze": "ours: analyze() in process",
    "scan": "ours: fast path scan, one thread",
    "sglang": "sglang log_parser.parse (polars)",
    "sglang-ray": "sglang's pattern, Ray-prefixed copy (polars)",
}


def _best(mode: str, path: str, args, runs: int) -> dict:
    results = [_run(mode, path, args.sglang_parser, args.sglang_path) for _ in range(runs)]
    good = [r for r in results if "error" not in r]
    return min(good, key=lambda r: r["seconds"]) if good else results[0]


def _report(results: dict[str, dict], lines: int) -> dict[str, float]:
    for mode, r in results.items():
        name = MODES[mode]
        if "error" in r:
            print(f"{name:48s} could not run: {r['error']}")
            continue
        r["lines_per_s"] = lines / r["seconds"]
        r["lines_per_cpu_s"] = lines / r["cpu"] if r["cpu"] else None
        print(f"{name:48s} {r['lines_per_s']:>11,.0f} lines/s  {r['seconds']:6.2f} s  cpu {r['cpu']:6.2f} s"
              f"  peak RSS {r['peak_rss_mb']:6.1f} MiB ({r['rss_of']})  events {r.get('events', '-')}")
        if "process_peaks_mb" in r:
            own = ", ".join(f"{k}: {v:.1f}" for k, v in r["process_peaks_mb"].items())
            print(f"{'':48s} each process's own peak (MiB): {own}; largest by getrusage "
                  f"{r['largest_process_rss_mb']:.1f} MiB; {r['samples']} samples")
    _targets(results)
    ratios = {}
    for baseline in ("sglang", "sglang-ray"):
        theirs = results.get(baseline, {})
        for mode in ("command", "analyze", "export"):
            ours = results.get(mode, {})
            if ours and theirs and "error" not in ours and "error" not in theirs:
                ratios[f"{mode}/{baseline}"] = theirs["seconds"] / ours["seconds"]
                print(f"ratio ours ({mode}) / {baseline}, lines/s on {lines:,} lines in the same run: "
                      f"{ratios[f'{mode}/{baseline}']:.2f}x")
    return ratios


PAIRED = ("command", "export")  # the modes `--baseline` runs: whole commands, which a PYTHONPATH can redirect


def _compile_ours() -> None:
    """Compile this tree's modules to bytecode, as pip does when it installs a package (the baseline's `pip
    --target` build is compiled so): a tree edited under PYTHONDONTWRITEBYTECODE=1 would otherwise compile every
    changed module again at each start of each run (~0.15 s of a command's start-up)."""
    spec = importlib.util.find_spec("toolkit")
    assert spec is not None and spec.origin is not None
    root = os.path.dirname(os.path.dirname(spec.origin))
    if not os.path.isfile(os.path.join(root, "setup.py")):
        return  # an installed build: pip compiled it
    compileall.compile_dir(root, quiet=1, rx=re.compile(r"[/\\](?:\.[^/\\]*|build|toolkit-out)(?:[/\\]|$)"))


def _baseline_site(commit: str, directory: str) -> str:
    """`commit` of this repository built into `directory` (a `git worktree` installed with `pip --target`)."""
    tree, site = os.path.join(directory, "tree"), os.path.join(directory, "site")
    subprocess.run(["git", "worktree", "add", "--detach", "-f", tree, commit], check=True, capture_output=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-t", site,
                        tree], check=True, capture_output=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], capture_output=True)
    return site


def _paired(mode: str, path: str, args, site: str, lines: int) -> dict:
    """`pairs` runs of ours and of the baseline, interleaved (the order flips every pair): every pair's seconds,
    CPU seconds and peak RSS of the process tree, its ratio (baseline seconds / ours: > 1 is faster), the median
    and the spread."""
    ours: list[dict] = []
    base: list[dict] = []
    for i in range(args.pairs):
        order = ((ours, None), (base, site)) if i % 2 == 0 else ((base, site), (ours, None))
        for into, where in order:
            into.append(_run(mode, path, None, None, site=where))
    failed = [r["error"] for r in ours + base if "error" in r]
    if failed:
        return {"error": failed[0]}
    ratios = [b["seconds"] / o["seconds"] for o, b in zip(ours, base)]
    out = {f"{who}_{name}": [r[key] for r in runs] for who, runs in (("ours", ours), ("baseline", base))
           for name, key in (("s", "seconds"), ("cpu_s", "cpu"), ("tree_rss_mb", "peak_rss_mb"))}
    out |= {"ratios": ratios, "median_ratio": statistics.median(ratios),
           "ours_median_lines_per_s": lines / statistics.median(o["seconds"] for o in ours),
           "baseline_median_lines_per_s": lines / statistics.median(b["seconds"] for b in base)}
    print(f"{MODES[mode]} vs baseline {args.baseline}, {args.pairs} pairs interleaved:")
    for k, (o, b, r) in enumerate(zip(ours, base, ratios)):
        print(f"  pair {k + 1}: ours {_one(o, lines)}  baseline {_one(b, lines)}  ratio {r:.2f}x")
    print(f"  median ratio {out['median_ratio']:.2f}x (spread {min(ratios):.2f}-{max(ratios):.2f}); median lines/s "
          f"ours {out['ours_median_lines_per_s']:,.0f}, baseline {out['baseline_median_lines_per_s']:,.0f}; peak "
          f"tree RSS ours max {max(out['ours_tree_rss_mb']):.1f} MiB, baseline max "
          f"{max(out['baseline_tree_rss_mb']):.1f} MiB")
    return out


def _one(r: dict, lines: int) -> str:
    return (f"{r['seconds']:5.2f} s ({lines / r['seconds']:>9,.0f} lines/s, cpu {r['cpu']:5.2f} s, "
            f"tree {r['peak_rss_mb']:5.1f} MiB)")


TARGETS = (("command", "lines_per_s", ">=", 1_000_000), ("command", "peak_rss_mb", "<", 300),
           ("export", "lines_per_s", ">=", 500_000))


def _targets(results: dict[str, dict]) -> None:
    """The issue's targets, met or not (a busy machine's figures say little: see the load average)."""
    for mode, key, op, bound in TARGETS:
        r = results.get(mode, {})
        if key in r:
            met = r[key] >= bound if op == ">=" else r[key] < bound
            print(f"target {mode} {key} {op} {bound:,}: {r[key]:,.1f} -> {'met' if met else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement; the fastest is reported")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--sglang-parser", default=None, help="a copy of SGLang's log_parser.py (never committed)")
    ap.add_argument("--sglang-path", default=None, help="a directory from which polars imports (pip --target)")
    ap.add_argument("--mix", choices=("realistic", "templates"), default="realistic", help="the log (module docstring)")
    ap.add_argument("--baseline", default=None, help="a commit of this repository: run `command` and `export` paired "
                    "with it, interleaved (built into a temporary directory)")
    ap.add_argument("--pairs", type=int, default=5, help="pairs of runs against --baseline")
    ap.add_argument("--save", action="store_true", help="write the results to benchmarks/results/diagnose_parse.json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--extra", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child, args.extra)
        return
    modes = [m for m in args.modes.split(",") if m in MODES]
    _compile_ours()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "mixed.log")
        write_log(log, args.lines, mix=args.mix)
        size = os.path.getsize(log)
        load_before = os.getloadavg()
        print(f"log: {args.lines:,} lines ({args.mix}), {size / 1e6:.0f} MB; python {sys.version.split()[0]}, {os.cpu_count()} "
              f"cores ({cpu_model()}); best of {args.runs} runs; load average before: "
              + " ".join(f"{x:.2f}" for x in load_before))
        results = {mode: _best(mode, log, args, args.runs) for mode in modes}
        paired = {}
        if args.baseline:
            site = _baseline_site(args.baseline, os.path.join(tmp, "baseline"))
            paired = {mode: _paired(mode, log, args, site, args.lines) for mode in modes if mode in PAIRED}
        load_after = os.getloadavg()
        print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    ratios = _report(results, args.lines)
    if args.save:
        mix = (MIX if args.mix == "realistic" else "50% decode, 25% prefill, 25% access; 5 forms")
        record = {
            **provenance("benchmarks.diagnose_parse", sys.argv[1:], "cpu"), "python": sys.version.split()[0],
            "log": {"lines": args.lines, "bytes": size, "mix": args.mix, "proportions": mix},
            "runs": args.runs, "load_average": {"before": load_before, "after": load_after},
            "results": results, "ratio_vs_sglang": ratios,
            **({"paired_with_baseline": {"baseline": args.baseline, "pairs": args.pairs, **paired}} if paired else {}),
        }
        print(f"wrote {write_result('diagnose_parse', record)}")


if __name__ == "__main__":
    main()
