"""Whole server logs of real engines under known mistunings, for diagnose's corpus (issue 49).

Each situation starts one engine with one known mistuning (or none), loads it with `toolkit bench` for minutes,
ends it as users' logs end (SIGTERM, a killed worker, or a refusal at start-up) and writes the whole log with a
sidecar whose advice is the mistuning's known answer, not diagnose's output:

    python -m benchmarks.record_engine_logs --list
    python -m benchmarks.record_engine_logs                       # every situation (about 80 minutes)
    python -m benchmarks.record_engine_logs --only vllm-max-num-seqs-2 --seconds 60

`toolkit serve` runs the embedded model; vLLM-CPU runs it from the bf16 folder that `../shared/peers/cpu_peers.sh`
makes (`--peers-root`, or PEERS_ROOT: `install-hf`, `convert`, `install-vllm`). Logs and sidecars go to
tests/diagnose/real_logs/recorded/ (`--out`); the sidecar's event counts are the log's lines of each kind counted by
their fixed words (`EVENT_WORDS`), the load lines and tracebacks an expert would count.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from benchmarks.common import REPO, cpu_model
from benchmarks.vs_vllm import SERVED_NAME, VLLM_STARTUP_TIMEOUT, Peers, vllm_server
from tests.server.server_process import children_of, cmdline
from toolkit.demo import QUESTIONS
from toolkit.tune.launcher import LaunchError, ServerProcess, free_port, serve_command, toolkit_command

OUT = REPO / "tests" / "diagnose" / "real_logs" / "recorded"
TOOLKIT_STARTUP_TIMEOUT = 300.0
DRAIN_TIMEOUT = 120.0  # after the arrivals end: the requests in flight finish, or bench's timeout aborts them
# the kinds an expert counts in these logs, by the words that start or mark each record
EVENT_WORDS = {
    "decode": ("Decode batch.",),
    "prefill": ("Prefill batch.",),
    "retract": ("KV cache pool is full. Retract requests.",),
    "stats": ("Avg prompt throughput:",),
    "exception": ("Traceback (most recent call last):",),
    "sigquit": ("Received sigquit",),
    "not_enough_memory": ("To serve at least one request with the model's max seq len",),
    "shed": ("Shed ",),
}
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass(frozen=True, kw_only=True)
class Load:
    """`toolkit bench` arguments: arrivals for `seconds` at `rate` (req/s), prompts of `input_len` random tokens
    asking for `output_len` tokens, at most `concurrency` in flight. `questions`: the demo's chat questions instead,
    each allowed `output_len` tokens but stopped at the end of its answer's first line (what admission cannot
    know)."""

    rate: str
    input_len: int = 256
    output_len: int = 128
    concurrency: int | None = None
    timeout: float = 120.0
    questions: bool = False


@dataclass(frozen=True, kw_only=True)
class Situation:
    name: str
    engine: str  # "toolkit" | "vllm"
    what: str
    kind: str
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    load: Load | None = None  # None: the engine refuses to start, there is nothing to load
    ending: str = "sigterm"  # "sigterm" | "sigint" (Ctrl-C: to the whole group) | "kill-worker" (halfway) | "refusal"
    verdict: str = "problem"  # "healthy" | "problem" | "crash": what an expert calls the server in this log
    advice: tuple[str, ...] = ()  # flags an expert changes; "a|b": either (the same knob by two names)
    direction: dict[str, str] = field(default_factory=dict)  # flag -> "raise" | "lower"
    nothing_to_advise: bool = False
    notes: str = ""


# vLLM's KV cache size by any of its names: the blocks forced at start, the bytes, or the memory fraction
KV_SIZE = "--num-gpu-blocks-override|--kv-cache-memory-bytes|--gpu-memory-utilization"
RAISE_KV = {flag: "raise" for flag in KV_SIZE.split("|")}

SITUATIONS = (
    # -- toolkit serve (SGLang's log lines) --
    Situation(name="toolkit-healthy-low-load", engine="toolkit", kind="healthy",
              what="defaults, 0.5 req/s of 256/128 tokens: the server idles between requests",
              load=Load(rate="0.5"), verdict="healthy", nothing_to_advise=True,
              notes="Low load on a default server: a few requests running, no queue, low token usage."),
    Situation(name="toolkit-healthy-saturated", engine="toolkit", kind="healthy",
              what="defaults, a closed loop of 32 clients sending 256/128 tokens back to back: the server always "
                   "full, as busy as it can be, nothing waits long",
              load=Load(rate="64", concurrency=32, timeout=120.0), verdict="healthy", nothing_to_advise=True,
              notes="Saturated by design: every decode line runs the clients' requests, the queue stays within "
                    "what the clients hold, the pool has room; no flag would serve these clients faster."),
    Situation(name="toolkit-running-cap-2", engine="toolkit", kind="running-cap",
              what="--max-running-requests 2 at 2 req/s of 256/64: two run, the rest queue, the pool is idle",
              flags=("--max-running-requests", "2"), load=Load(rate="2", output_len=64, timeout=60.0),
              advice=("--max-running-requests",), direction={"--max-running-requests": "raise"},
              notes="Two requests run in every decode line while the queue grows and token usage stays near zero."),
    Situation(name="toolkit-kv-pool-1024", engine="toolkit", kind="kv-small",
              what="--max-total-tokens 1024 at 2 req/s of 256/128: the pool holds two requests of this size",
              flags=("--max-total-tokens", "1024"), load=Load(rate="2", timeout=60.0),
              advice=("--max-total-tokens|--mem-fraction-static",),
              direction={"--max-total-tokens": "raise", "--mem-fraction-static": "raise"},
              notes="A pool of 1,024 tokens holds two requests of 384; the rest queue with usage high."),
    Situation(name="toolkit-chunked-prefill-32", engine="toolkit", kind="prefill-chunk",
              what="--chunked-prefill-size 32 at 1 req/s of 1024/32: every prompt takes 32 prefill steps",
              flags=("--chunked-prefill-size", "32"), load=Load(rate="1", input_len=1024, output_len=32, timeout=60.0),
              advice=("--chunked-prefill-size",), direction={"--chunked-prefill-size": "raise"},
              notes="Prefill lines of 32 new tokens each, a queue behind them: the chunk limits the step."),
    Situation(name="toolkit-conservativeness-3", engine="toolkit", kind="admission",
              what="--schedule-conservativeness 3 with a 4096-token pool, 6 req/s of chat questions allowed 1,024 "
                   "tokens that stop at their first line: admission reserves room the requests never use",
              flags=("--schedule-conservativeness", "3", "--max-total-tokens", "4096"),
              load=Load(rate="6", output_len=1024, timeout=60.0, questions=True),
              advice=("--schedule-conservativeness",), direction={"--schedule-conservativeness": "lower"},
              notes="The queue grows while token usage stays low: each admitted request reserves its whole "
                    "max_new_tokens at ratio 1."),
    Situation(name="toolkit-retraction-storm", engine="toolkit", kind="retraction",
              what="--schedule-conservativeness 0.1 with a 2048-token pool at 4 req/s of 64/512: admission "
                   "over-commits and decode retracts",
              flags=("--schedule-conservativeness", "0.1", "--max-total-tokens", "2048"),
              load=Load(rate="4", input_len=64, output_len=512, timeout=90.0),
              advice=("--schedule-conservativeness",), direction={"--schedule-conservativeness": "raise"},
              notes="Retraction lines repeat: admission at ratio 0.07 lets in more decode than the pool holds."),
    Situation(name="toolkit-shedding-overload", engine="toolkit", kind="shedding",
              what="--max-queued-requests 4 at 8 req/s of 256/128: far past capacity, the excess gets 503",
              flags=("--max-queued-requests", "4"), load=Load(rate="8", timeout=60.0),
              notes="Overload shed by the queue cap as configured: the server is at capacity; no flag makes it "
                    "faster (more replicas would)."),
    Situation(name="toolkit-scheduler-killed", engine="toolkit", kind="crash",
              what="defaults under 1 req/s; the scheduler process is SIGKILLed halfway",
              load=Load(rate="1"), ending="kill-worker", verdict="crash",
              notes="A killed scheduler: the server dies; no flag helps."),
    # -- vLLM-CPU (V1) --
    Situation(name="vllm-healthy-sigterm", engine="vllm", kind="healthy",
              what="defaults (4 GiB KV), 1 req/s of 256/128, then SIGTERM as Ctrl-C would",
              load=Load(rate="1"), verdict="healthy", nothing_to_advise=True,
              notes="A healthy server stopped cleanly: the EngineDeadError after the SIGTERM is vLLM's own "
                    "shutdown, not a crash."),
    Situation(name="vllm-max-num-seqs-2", engine="vllm", kind="running-cap",
              what="--max-num-seqs 2 at 2 req/s of 256/64: two run, the rest wait, KV usage is near zero",
              flags=("--max-num-seqs", "2"), load=Load(rate="2", output_len=64, timeout=60.0),
              advice=("--max-num-seqs",), direction={"--max-num-seqs": "raise"},
              notes="Running: 2 reqs on every stats line, Waiting grows, KV cache usage under 1 %."),
    Situation(name="vllm-kv-cache-1k-tokens", engine="vllm", kind="kv-small",
              what="--num-gpu-blocks-override 8 (1,024 tokens of 128-token blocks, one of them vLLM's null block; "
                   "--max-model-len 512, which vLLM requires to fit the cache) at 2 req/s of 256/256",
              flags=("--num-gpu-blocks-override", "8", "--max-model-len", "512"),
              load=Load(rate="2", output_len=256, timeout=60.0),
              advice=(KV_SIZE,), direction=RAISE_KV,
              notes="Maximum concurrency about 2x at start-up; Running stays at 2 with KV usage high and a queue."),
    Situation(name="vllm-batched-tokens-64", engine="vllm", kind="step-budget",
              what="--max-num-batched-tokens 64 --max-num-seqs 64 at 1 req/s of 1024/32: prompts go 64 tokens a step",
              flags=("--max-num-batched-tokens", "64", "--max-num-seqs", "64"),
              load=Load(rate="1", input_len=1024, output_len=32, timeout=60.0),
              advice=("--max-num-batched-tokens",), direction={"--max-num-batched-tokens": "raise"},
              notes="Prompt throughput capped near 64 tokens a step while requests wait and KV usage is low."),
    Situation(name="vllm-context-over-cache", engine="vllm", kind="startup-refusal",
              what="--max-model-len 8192 with a KV cache of 1,024 tokens (--num-gpu-blocks-override 8; vLLM-CPU "
                   "sizes its cache by VLLM_CPU_KVCACHE_SPACE and ignores --kv-cache-memory-bytes): one request of "
                   "the max length does not fit, vLLM refuses to start",
              flags=("--max-model-len", "8192", "--num-gpu-blocks-override", "8"), ending="refusal",
              advice=("--max-model-len|" + KV_SIZE,), direction={"--max-model-len": "lower", **RAISE_KV},
              notes="The start-up ValueError names the KV needed for the max seq len and the estimated maximum."),
    Situation(name="vllm-preemption-storm", engine="vllm", kind="preemption",
              what="--num-gpu-blocks-override 16 (2,048 tokens; --max-model-len 1024) at 4 req/s of 64/512: "
                   "running requests outgrow the cache and are preempted",
              flags=("--num-gpu-blocks-override", "16", "--max-model-len", "1024"),
              load=Load(rate="4", input_len=64, output_len=512, timeout=90.0),
              advice=(KV_SIZE,), direction=RAISE_KV,
              notes="The stats lines' Preemptions count climbs with KV usage near 100 %."),
    Situation(name="vllm-client-too-slow", engine="vllm", kind="client-bound",
              what="defaults, the client keeps one request in flight (--max-concurrency 1) at 4 req/s",
              load=Load(rate="4", concurrency=1, timeout=60.0), verdict="healthy", nothing_to_advise=True,
              notes="Running: 1 req, Waiting: 0 on every line: the server waits for its client."),
    Situation(name="vllm-engine-core-killed", engine="vllm", kind="crash",
              what="defaults under 1 req/s; the EngineCore process is SIGKILLed halfway",
              load=Load(rate="1"), ending="kill-worker", verdict="crash",
              notes="A killed engine core: the API server reports the engine dead; no flag helps."),
    # -- recorded batch 2 (2026-12-02): the healthy loads batch 1 lacked, and batch 1's mistunings at other sizes --
    Situation(name="toolkit-healthy-medium", engine="toolkit", kind="healthy",
              what="defaults, 2 req/s of 256/128: about a quarter of what the server decodes at saturation here",
              load=Load(rate="2"), verdict="healthy", nothing_to_advise=True,
              notes="Medium load on a default server: several requests running, any queue short-lived, token "
                    "usage low."),
    Situation(name="toolkit-running-cap-6", engine="toolkit", kind="running-cap",
              what="--max-running-requests 6 at 6 req/s of 128/128: six run, arrivals outpace them, the pool is idle",
              flags=("--max-running-requests", "6"), load=Load(rate="6", input_len=128, timeout=90.0),
              advice=("--max-running-requests",), direction={"--max-running-requests": "raise"},
              notes="Six requests run in every decode line while the queue grows and token usage stays low."),
    Situation(name="toolkit-kv-pool-2048-long", engine="toolkit", kind="kv-small",
              what="--max-total-tokens 2048 at 2 req/s of 512/384: the pool holds two requests of this size",
              flags=("--max-total-tokens", "2048"), load=Load(rate="2", input_len=512, output_len=384, timeout=90.0),
              advice=("--max-total-tokens|--mem-fraction-static",),
              direction={"--max-total-tokens": "raise", "--mem-fraction-static": "raise"},
              notes="A pool of 2,048 tokens holds two requests of up to 896; the rest queue with usage high."),
    Situation(name="vllm-healthy-medium", engine="vllm", kind="healthy",
              what="defaults (4 GiB KV), 3 req/s of 128/64 (about a third of its saturated decode here), then SIGTERM",
              load=Load(rate="3", input_len=128, output_len=64), verdict="healthy", nothing_to_advise=True,
              notes="Medium load: a few requests running, Waiting at or near 0, KV usage low; a clean stop."),
    Situation(name="vllm-healthy-saturated", engine="vllm", kind="healthy",
              what="defaults, a closed loop of 16 clients sending 256/128 back to back, then SIGTERM",
              load=Load(rate="32", concurrency=16, timeout=120.0), verdict="healthy", nothing_to_advise=True,
              notes="Saturated by design: Running near 16 on every line, Waiting within what the clients hold, KV "
                    "usage with room; no flag serves these clients faster."),
    Situation(name="vllm-max-num-seqs-4", engine="vllm", kind="running-cap",
              what="--max-num-seqs 4 at 3 req/s of 128/128: four run, the rest wait, KV usage is low",
              flags=("--max-num-seqs", "4"), load=Load(rate="3", input_len=128, timeout=90.0),
              advice=("--max-num-seqs",), direction={"--max-num-seqs": "raise"},
              notes="Running: 4 reqs on every stats line, Waiting grows, KV cache usage low."),
    # -- recorded batch 3 (2026-12-03): long outputs, short requests, a Ctrl-C stop; answers fixed before recording --
    Situation(name="vllm-healthy-low-load-ctrl-c", engine="vllm", kind="healthy",
              what="defaults, 0.3 req/s of 256/128, then Ctrl-C (SIGINT to the server's process group)",
              load=Load(rate="0.3"), ending="sigint", verdict="healthy", nothing_to_advise=True,
              notes="Low load on a default server: one or two requests running, nothing waiting, KV usage low; "
                    "stopped by Ctrl-C, which is no crash whatever the shutdown prints."),
    Situation(name="toolkit-client-too-slow-ctrl-c", engine="toolkit", kind="client-bound",
              what="defaults, the client keeps one request in flight (--max-concurrency 1) at 4 req/s of 256/128, "
                   "then Ctrl-C",
              load=Load(rate="4", concurrency=1, timeout=60.0), ending="sigint", verdict="healthy",
              nothing_to_advise=True,
              notes="#running-req: 1 and #queue-req: 0 on every decode line: the server waits for its client; "
                    "stopped by Ctrl-C."),
    Situation(name="vllm-kv-cache-2k-long", engine="vllm", kind="kv-small",
              what="--num-gpu-blocks-override 16 (2,048 tokens of 128-token blocks; --max-model-len 1024) at 2 req/s "
                   "of 512/384: the cache holds two requests of this size at their end",
              flags=("--num-gpu-blocks-override", "16", "--max-model-len", "1024"),
              load=Load(rate="2", input_len=512, output_len=384, timeout=90.0),
              advice=(KV_SIZE,), direction=RAISE_KV,
              notes="A 16-block cache against requests that grow to 7 blocks: two or three run, KV usage high, the "
                    "rest wait or are preempted."),
    Situation(name="vllm-max-num-seqs-8-long", engine="vllm", kind="running-cap",
              what="--max-num-seqs 8 at 1 req/s of 64/512: eight decode for a long time, the rest wait, KV usage low",
              flags=("--max-num-seqs", "8"), load=Load(rate="1", input_len=64, output_len=512, timeout=120.0),
              advice=("--max-num-seqs",), direction={"--max-num-seqs": "raise"},
              notes="Running: 8 reqs on every stats line, Waiting grows, KV cache usage a few percent."),
    Situation(name="toolkit-kv-pool-768-short", engine="toolkit", kind="kv-small",
              what="--max-total-tokens 768 at 8 req/s of 64/64: the pool holds six requests of 128 tokens",
              flags=("--max-total-tokens", "768"), load=Load(rate="8", input_len=64, output_len=64, timeout=60.0),
              advice=("--max-total-tokens|--mem-fraction-static",),
              direction={"--max-total-tokens": "raise", "--mem-fraction-static": "raise"},
              notes="A 768-token pool: about six short requests run, token usage high, the queue grows."),
    Situation(name="toolkit-running-cap-4-long", engine="toolkit", kind="running-cap",
              what="--max-running-requests 4 at 1 req/s of 64/512: four decode for a long time, the rest queue, the "
                   "pool is nearly empty",
              flags=("--max-running-requests", "4"), load=Load(rate="1", input_len=64, output_len=512, timeout=120.0),
              advice=("--max-running-requests",), direction={"--max-running-requests": "raise"},
              notes="Four requests run in every decode line while the queue grows and token usage stays low."),
)


def count_events(lines: list[str]) -> dict[str, int]:
    """The records of each kind, by their words; a chained traceback ("During handling ...") is one record."""
    counts = {kind: 0 for kind in EVENT_WORDS}
    for i, line in enumerate(lines):
        for kind, words in EVENT_WORDS.items():
            if any(word in line for word in words):
                chained = kind == "exception" and any(c in text for text in lines[max(0, i - 3):i] for c in CHAINED)
                counts[kind] += 0 if chained else 1
    return {kind: n for kind, n in counts.items() if n}


def bench_command(load: Load, port: int, seconds: float, tokenizer: str | None, work: Path) -> list[str]:
    command = toolkit_command(
        "bench", "--base-url", f"http://127.0.0.1:{port}", "--rate", load.rate, "--duration", str(seconds),
        "--warmup-requests", "0", "--request-timeout", str(load.timeout), "--no-progress")
    if load.questions:
        prompts = work / "questions.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS))
        command += ["--backend", "openai-chat", "--dataset", "custom", "--dataset-path", str(prompts),
                    "--sharegpt-output-len", str(load.output_len), "--no-ignore-eos",
                    "--extra-request-body", json.dumps({"stop": ["\n"]})]
    else:
        command += ["--backend", "openai", "--dataset", "random", "--random-input-len", str(load.input_len),
                    "--random-output-len", str(load.output_len), "--random-range-ratio", "1.0"]
    if load.concurrency is not None:
        command += ["--max-concurrency", str(load.concurrency)]
    return command + (["--tokenizer", tokenizer] if tokenizer else [])


def worker_pid(server: ServerProcess, engine: str) -> int:
    """The process that runs the model: our scheduler, or vLLM's engine core."""
    mark = "multiprocessing.spawn" if engine == "toolkit" else "EngineCore"
    for pid in children_of(server.pid):
        title = cmdline(pid) + Path(f"/proc/{pid}/comm").read_text(errors="replace")
        if mark in title:
            return pid
    raise LaunchError(f"no {mark} process under {server.pid}")


def start(situation: Situation, port: int, work: Path, peers: Peers) -> tuple[ServerProcess, Path]:
    """The server (running), and the file its log goes to."""
    if situation.engine == "toolkit":
        log = work / "server.log"
        command = serve_command(port, "--served-model-name", SERVED_NAME, *situation.flags, log_file=log)
        return ServerProcess(command, port, work / "server.out", env={**os.environ, **situation.env}), log
    out = work / "server.out"
    return vllm_server(peers, port, out, "bfloat16", situation.env, *situation.flags), out


def run_load(situation: Situation, server: ServerProcess, seconds: float, peers: Peers, work: Path) -> None:
    tokenizer = str(peers.model) if situation.engine == "vllm" else None
    bench = subprocess.Popen(bench_command(situation.load, server.port, seconds, tokenizer, work), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    if situation.ending == "kill-worker":
        time.sleep(seconds / 2)
        os.kill(worker_pid(server, situation.engine), signal.SIGKILL)
    try:
        bench.wait(timeout=seconds + situation.load.timeout + DRAIN_TIMEOUT)
    except subprocess.TimeoutExpired:
        bench.kill()
    print((bench.stdout.read() if bench.stdout else "")[-1500:], flush=True)


def record(situation: Situation, seconds: float, out: Path, peers: Peers, work: Path) -> Path:
    port = free_port()
    server, log = start(situation, port, work, peers)
    timeout = TOOLKIT_STARTUP_TIMEOUT if situation.engine == "toolkit" else VLLM_STARTUP_TIMEOUT
    try:
        if situation.ending == "refusal":
            server.proc.wait(timeout=timeout)
        else:
            server.wait_healthy(timeout)
            run_load(situation, server, seconds, peers, work)
            if situation.ending == "kill-worker":
                server.proc.wait(timeout=60)
            if situation.ending == "sigint":  # NOTE: a terminal's Ctrl-C reaches every process of the group
                os.killpg(server.proc.pid, signal.SIGINT)
                server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        server.stop()
    return write(situation, log.read_text(errors="replace"), seconds, out)


def header(situation: Situation, seconds: float) -> list[str]:
    version = "toolkit serve (this repository)" if situation.engine == "toolkit" else "vLLM-CPU 0.32 (V1)"
    loaded = f"{seconds:.0f} s of toolkit bench" if situation.load else "no load (refused at start-up)"
    return [f"# source: recorded by benchmarks/record_engine_logs.py ({situation.name})",
            f"# date: {date.today().isoformat()}",
            f"# engine: {version}, embedded SmolLM2-135M-Instruct on {cpu_model()}, 2 cores; {loaded}",
            f"# what: {situation.what}"]


def write(situation: Situation, log_text: str, seconds: float, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = log_text.splitlines()
    path = out / f"{situation.name}.log"
    path.write_text("\n".join(header(situation, seconds) + lines) + "\n")
    expect = {"engine": "sglang" if situation.engine == "toolkit" else "vllm",
              "version": "toolkit" if situation.engine == "toolkit" else "0.32 V1",
              "kind": situation.kind, "verdict": situation.verdict, "events": count_events(lines),
              "advice": list(situation.advice), "direction": situation.direction,
              "nothing_to_advise": situation.nothing_to_advise,
              "notes": situation.notes}
    path.with_suffix(".expect.json").write_text(json.dumps(expect, indent=1) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated situation names (default: all)")
    parser.add_argument("--engine", choices=("toolkit", "vllm"), help="only this engine's situations")
    parser.add_argument("--seconds", type=float, default=180.0, help="seconds of load per situation")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--peers-root", type=Path, default=Path(os.environ.get("PEERS_ROOT", "/tmp")))
    parser.add_argument("--list", action="store_true", help="print the situations and exit")
    return parser.parse_args(argv)


def chosen(args: argparse.Namespace) -> list[Situation]:
    names = {n for n in args.only.split(",") if n}
    unknown = names - {s.name for s in SITUATIONS}
    if unknown:
        raise SystemExit(f"unknown situations: {', '.join(sorted(unknown))}")
    return [s for s in SITUATIONS if (not names or s.name in names) and args.engine in (None, s.engine)]


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    situations = chosen(args)
    if args.list:
        for s in situations:
            print(f"{s.name:32} {s.engine:8} {s.what}")
        return 0
    peers = Peers(args.peers_root)
    if any(s.engine == "vllm" for s in situations) and peers.missing():
        print(f"missing: {'; '.join(peers.missing())}: run ../shared/peers/cpu_peers.sh install-hf, convert and "
              "install-vllm with PEERS_ROOT set", file=sys.stderr)
        return 2
    failed = []
    for situation in situations:
        print(f"== {situation.name}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"record-{situation.name}-") as work:
            try:
                path = record(situation, args.seconds, args.out, peers, Path(work))
            except LaunchError as exc:  # NOTE: not the situation asked for: nothing is written
                print(f"   not recorded: {exc}"[-3000:], flush=True)
                failed.append(situation.name)
                continue
        print(f"   {path} ({sum(1 for _ in path.open())} lines)", flush=True)
    if failed:
        print(f"not recorded: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
