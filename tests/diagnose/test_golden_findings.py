"""Golden findings: for every real-log excerpt and a set of synthetic logs that fire every rule, the findings (id,
severity, title, flag, suggested, current) and the corrected launch command are those stored in
golden/findings.json. A change to a rule's advice, or to how advice is rendered or applied, shows up here.

Regenerate (only when a change to the findings is intended): `python -m tests.diagnose.test_golden_findings --write`.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Rank, Startup, VllmLog
from toolkit.diagnose import Diagnosis, analyze

HERE = Path(__file__).parent
CORPUS = HERE / "real_logs"
GOLDEN = HERE / "golden" / "findings.json"
N = 30
ARGS = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, mem_fraction_static=0.85,
            schedule_policy="fcfs", cuda_graph_max_bs=256)


def _base(startup: Startup = Startup(), era: str = "0.4.9", rank: Rank = Rank(), **args: object) -> Log:
    return Log(era, rank).start(startup, **{**ARGS, **args})


def _mask(k: int, n: int = N) -> list[bool]:
    return [((i * k) // n) != (((i + 1) * k) // n) for i in range(n)]


def _crash(message: str) -> list[str]:
    return _base().decode_series(5).add(message, dt=1).lines


def _oom(phase: str) -> list[str]:
    log = _base().decode_series(10, running=200)
    return log.add("\n".join(lf.oom_block(phase, 8192, 100, 20)), dt=1).lines


def _retractions(n: int) -> list[str]:
    log, every = _base(), 300 // n
    for i in range(301):
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=3000, queue=0), dt=2)
        if i % every == 1 and n > 0:
            n -= 1
            log.add(lf.retract("0.4.9", k=2, old=0.5, new=0.9))
    return log.lines


def _collapse(cause: str | None) -> list[str]:
    log = _base().decode_series(30, running=120, queue=3, usage=0.93, throughput=3000.0)
    if cause == "retraction":
        log.add(lf.retract("0.4.9", k=1, old=0.5, new=0.9), dt=1)
    graph = cause != "graph"
    return log.decode_series(30, running=120, queue=3, usage=0.93, throughput=300.0, graph=graph).lines


def _graph_collapse_past_ceiling() -> list[str]:
    log = _base().decode_series(30, running=250, queue=3, usage=0.93, throughput=3000.0)
    return log.decode_series(30, running=300, queue=3, usage=0.93, throughput=300.0, graph=False).lines


def _prefills(policy: str, cached: int, queue: int) -> list[str]:
    log = _base(schedule_policy=policy)
    for _ in range(N):
        log.add(lf.prefill("0.4.9", new_seq=2, new_token=1000 - cached, cached=cached, running=100, queue=queue,
                           usage=0.5, token=300000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=3000, queue=queue), dt=1)
    return log.lines


def _stalls() -> list[str]:
    log = _base(chunked_prefill_size=8192)
    for m in _mask(6, 40):
        if m:
            log.add(lf.prefill("0.4.9", new_seq=1, new_token=8192, cached=0, running=100, queue=3, usage=0.5,
                               token=300000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=500 if m else 3000, queue=3),
                dt=2)
    return log.lines


def _small_chunk() -> list[str]:
    """1200-token prompts queued behind a 256-token chunk with the pool nearly empty."""
    log = _base(Startup(chunk=256), chunked_prefill_size=256)
    for i in range(N):
        seqs = 2 if i % 5 == 4 else 1  # a prompt ends inside every fifth step and the next one starts there
        log.add(lf.prefill("0.4.9", new_seq=seqs, new_token=256, cached=0, running=4, queue=6, usage=0.05,
                           token=30000), dt=1)
        log.add(lf.decode("0.4.9", running=4, token=30000, usage=0.05, throughput=300, queue=6), dt=1)
    return log.lines


def _shedding() -> list[str]:
    log = _base()
    for i in range(N):
        log.add(lf.prefill("0.4.9", new_seq=2, new_token=1000, cached=0, running=100, queue=20, usage=0.9,
                           token=600000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=600000, usage=0.9, throughput=3000, queue=20), dt=1)
        if i % 5 == 0:
            log.add(lf.shed(first=i == 0, queue_full=8), scheduler=False)
    return log.lines


def _clients_give_up() -> list[str]:
    log = _base().decode_series(N, queue=list(range(100, 100 + 40 * N, 40)), usage=0.95)
    for _ in range(4):
        log.add(lf.client_gone(), dt=1, scheduler=False)
    return log.lines


def _vllm_fatal(log: VllmLog, *texts: str) -> list[str]:
    for text in texts:
        log.add(text, level="ERROR", file="core.py:708", process="EngineCore_DP0")
    return log.lines


def _vllm_v0_preemptions() -> list[str]:
    log = VllmLog().start().stats_series(N, running=20, waiting=0, usage=0.5, gen=1000.0)
    for i in range(4):
        log.add("Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
                f"space. total_num_cumulative_preemption={i + 1}", dt=10, level="WARNING", file="scheduler.py:1481")
    return log.lines


def _vllm_collapse() -> list[str]:
    log = VllmLog().start(gpu_memory_utilization=0.85).stats_series(30, running=120, waiting=3, usage=0.93, gen=3000.0)
    log.add("Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
            "space. total_num_cumulative_preemption=1", dt=1, level="WARNING", file="scheduler.py:1481")
    return log.stats_series(30, running=120, waiting=3, usage=0.93, gen=300.0).lines


def _vllm_batch_budget() -> list[str]:
    log = VllmLog().start().add("Chunked prefill is enabled with max_num_batched_tokens=2048.", file="scheduler.py:308")
    return log.stats_series(N, running=40, waiting=25, usage=0.3, gen=2000.0).lines


_LEAK = ("token_to_kv_pool_allocator memory leak detected! available_size=10, protected_size=0, "
         "self.max_total_num_tokens=665690")
_MAX_SEQ_LEN = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache "
                "is needed, which is larger than the available KV cache memory (9.45 GiB). Based on the available "
                "memory, the estimated maximum model length is 77392.")
_MAX_SEQ_V0 = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
               "stored in KV cache (16816). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
               "initializing the engine.")
_CUDA_OOM = ("EngineCore encountered a fatal error.", "Traceback (most recent call last):",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")

SYNTHETIC: dict[str, Callable[[], list[str]]] = {
    "crash-exception": lambda: _crash("Scheduler hit an exception: Traceback (most recent call last):\n"
                                      "  File \"x.py\", line 1\nAssertionError: bad batch"),
    "crash-watchdog": lambda: _crash(lf.watchdog("0.4.9", 300)),
    "crash-leak": lambda: _crash(_LEAK),
    "crash-graph-capture": lambda: _crash("Capture cuda graph failed: CUDA out of memory\n"
                                          "Possible solutions: lower --mem-fraction-static"),
    "crash-sigquit": lambda: _crash("Received sigquit from a child proces. It usually means the child failed."),
    "pd-transfer-peer-gone": lambda: _crash(
        "Prefill transfer failed for request rank=0 req.rid='05d7' req.bootstrap_room=8 with exception "
        "KVTransferError(bootstrap_room=8): Decode instance could be dead, remote mooncake session 10.0.0.1:1 is not "
        "alive"),
    "oom-prefill": lambda: _oom("prefill"),
    "oom-decode": lambda: _oom("decode"),
    "oom-other": lambda: _crash("Scheduler hit an exception: Traceback (most recent call last):\n  File \"x.py\", "
                                "line 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
    "oom-startup-without-fraction": lambda: Log("0.4.9").start(Startup(), model_path="m")
    .add("Not enough memory. Please try to increase --mem-fraction-static.").lines,
    "oom-startup": lambda: _base().add("Not enough memory. Please try to increase --mem-fraction-static. Current "
                                       "value: self.server_args.mem_fraction_static=0.85").lines,
    "gpu-memory-too-little": lambda: _base(Startup(available=4.0)).decode_series(5).lines,
    "gpu-memory-spare": lambda: _base(Startup(available=9.0)).decode_series(5).lines,
    "gpu-memory-too-much": lambda: _base(Startup(available=12.0)).decode_series(5).lines,
    "gpu-memory-without-fraction": lambda: Log("0.4.9").start(Startup(available=12.0), model_path="m")
    .decode_series(5).lines,
    "capacity-pool-bound-memory": lambda: _base(Startup(available=12.0)).decode_series(N, running=200, queue=8,
                                                                                       usage=0.95).lines,
    "capacity-pool-bound-fp8": lambda: _base(Startup(available=6.5)).decode_series(N, running=200, queue=8,
                                                                                   usage=0.95).lines,
    "capacity-pool-bound-client": lambda: _base(Startup(available=6.5), kv_cache_dtype="fp8_e5m2")
    .decode_series(N, running=200, queue=8, usage=0.95).lines,
    "capacity-context-exceeds-pool": lambda: _base(Startup(max_total=65535)).decode_series(5).lines,
    "capacity-pool-vs-concurrency": lambda: _base(Startup(max_total=655360, max_running=11), max_running_requests=11)
    .decode_series(5).lines,
    "retraction-frequent": lambda: _retractions(11),
    "retraction-storm": lambda: _retractions(150),
    "throughput-collapse-retraction": lambda: _collapse("retraction"),
    "throughput-collapse-graph": lambda: _collapse("graph"),
    "throughput-collapse-graph-ceiling": _graph_collapse_past_ceiling,
    "throughput-collapse-unexplained": lambda: _collapse(None),
    "usage-low-while-queued": lambda: _base().decode_series(N, queue=20, usage=0.5).lines,
    "usage-low-while-queued-low-conservativeness": lambda: _base(schedule_conservativeness=0.4)
    .decode_series(N, queue=20, usage=0.5).lines,
    "running-cap-pinned": lambda: _base(Startup(max_running=128)).decode_series(N, running=128, queue=40,
                                                                                usage=0.79).lines,
    "queue-empty-under-load": lambda: _base().decode_series(N, queue=0, usage=0.5).lines,
    "queue-too-long-fcfs": lambda: _base().decode_series(N, queue=3000, usage=0.95).lines,
    "queue-too-long-lpm": lambda: _base(schedule_policy="lpm").decode_series(N, queue=3000, usage=0.95).lines,
    "shedding-too-much": _shedding,
    "shedding-clients-give-up": _clients_give_up,
    "cuda-graph-not-used-above-max": lambda: _base().decode_series(
        N, running=[300 if x else 200 for x in _mask(6)], graph=[not x for x in _mask(6)], queue=5).lines,
    "cuda-graph-not-used-within-max": lambda: _base().decode_series(
        N, running=100, graph=[not x for x in _mask(10)], queue=5).lines,
    "cuda-graph-ceiling": lambda: _base(era="0.4.3").decode_series(N, running=300, queue=2).lines,
    "cuda-graph-disabled": lambda: _base(disable_cuda_graph=True).decode_series(N, running=8, queue=5).lines,
    "cuda-graph-capture-memory": lambda: _base(Startup(graph_mem=1.5, available=1.45)).decode_series(5).lines,
    "prefill-stall": _stalls,
    "prefill-chunk-too-small": _small_chunk,
    "schedule-policy-try-lpm": lambda: _prefills("fcfs", cached=300, queue=30),
    "schedule-policy-try-fcfs": lambda: _prefills("lpm", cached=49, queue=150),
    "parallelism-dp-over-tp": lambda: _base(rank=Rank(tp=0, tp_size=2), tp_size=2).decode_series(5).lines,
    "torch-compile-small-model": lambda: _base(Startup(weights=2.5)).decode_series(N, running=16, usage=0.05).lines,
    "fp8-kv-and-weights": lambda: _base(Startup(weights=40.0)).decode_series(N, queue=10, usage=0.95).lines,
    "vllm-pool-bound": lambda: VllmLog().start(gpu_memory_utilization=0.85)
    .stats_series(N, running=200, waiting=40, usage=0.97, gen=3000.0).lines,
    "vllm-pool-vs-concurrency": lambda: VllmLog().start(tp=2, max_num_seqs=64, gpu_memory_utilization=0.85).lines,
    "vllm-preemption-storm": lambda: VllmLog().start().stats_series(N, running=200, waiting=10, usage=0.99,
                                                                    gen=3000.0, preemptions=[0, 5]).lines,
    "vllm-v0-preemptions": _vllm_v0_preemptions,
    "vllm-usage-low-while-queued": _vllm_batch_budget,
    "vllm-throughput-collapse-preemption": _vllm_collapse,
    "vllm-running-cap-pinned": lambda: VllmLog().start(max_num_seqs=64).stats_series(N, running=64, waiting=30,
                                                                                     usage=0.79, gen=2000.0).lines,
    "vllm-queue-empty": lambda: VllmLog().start().stats_series(N, running=10, waiting=0, usage=0.1, gen=500.0).lines,
    "vllm-cuda-graph-ceiling": lambda: VllmLog().start().stats_series(N, running=600, waiting=0, usage=0.5,
                                                                      gen=9000.0).lines,
    "vllm-enforce-eager": lambda: VllmLog().start(enforce_eager=True).stats_series(N, running=8, waiting=0, usage=0.1,
                                                                                   gen=500.0).lines,
    "vllm-max-model-len": lambda: _vllm_fatal(VllmLog().start(kv_tokens=20000, max_model_len=131072),
                                              "EngineCore failed to start.", _MAX_SEQ_LEN),
    "vllm-cuda-oom": lambda: _vllm_fatal(VllmLog().start(gpu_memory_utilization=0.95)
                                         .stats_series(N, running=10, waiting=0, usage=0.2, gen=900.0), *_CUDA_OOM),
    "vllm-capture-memory": lambda: VllmLog().start(graph_gb=12.0, kv_gb=40.0).stats_series(
        N, running=8, waiting=0, usage=0.1, gen=500.0).lines,
    "vllm-max-seq-len-v0": lambda: [_MAX_SEQ_V0],
    "vllm-no-kv-cache-memory": lambda: VllmLog().start(kv_gb=-1.2).lines,
    "oom-graph-capture": lambda: _base().add("Capture cuda graph begin. This can take up to several minutes.", dt=1)
    .add("\n".join(_CUDA_OOM[1:]), dt=1).lines,
    "vllm-oom-graph-capture": lambda: _vllm_fatal(VllmLog().start(), _CUDA_OOM[0], _CUDA_OOM[1],
                                                  '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in '
                                                  "capture_model", _CUDA_OOM[2]),
    "short-pool-bound": lambda: Log("0.4.9").decode_series(2, running=6, queue=5, usage=0.94).lines,
    "short-prefill-bound": lambda: Log("0.4.9").decode_series(3, running=8, queue=300, usage=0.05).lines,
    "speculative-low-acceptance": lambda: [
        f"[2026-08-14 14:02:{i:02d} TP0] Decode batch, #running-req: 3, #token: 266624, token usage: 0.43, accept "
        "len: 1.70, accept rate: 0.14, cuda graph: True, gen throughput (token/s): 183.10, #queue-req: 0"
        for i in range(5)],
}


def _bench(folder: Path) -> Path:
    path = folder / "golden-bench.jsonl"
    path.write_text(json.dumps({"request_rate": 10.0, "achieved_rate": 5.0, "send_lag_p99_ms": 80.0}) + "\n")
    return path


def snapshot(d: Diagnosis) -> dict[str, Any]:
    """What a diagnosis advises: each finding's identity and advice, and the corrected command."""
    keys = ("id", "severity", "title", "flag", "suggested", "current")
    return {"findings": [{k: getattr(f, k) for k in keys} for f in d.findings], "command": d.command}


def inputs(folder: Path) -> dict[str, Callable[[], Diagnosis]]:
    """Every golden input by name: the real-log excerpts, then the synthetic scenarios."""
    out: dict[str, Callable[[], Diagnosis]] = {}
    for log in sorted(CORPUS.glob("**/*.log")):
        out[f"real/{log.relative_to(CORPUS)}"] = lambda log=log: analyze([log])
    for name, lines in SYNTHETIC.items():
        out[f"synthetic/{name}"] = lambda lines=lines: analyze(lines=lines())
    out["synthetic/client-bottleneck"] = lambda: analyze(lines=_base().decode_series(5).lines,
                                                         bench=str(_bench(folder)))
    return out


def current(folder: Path) -> dict[str, dict[str, Any]]:
    return {name: snapshot(run()) for name, run in inputs(folder).items()}


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict[str, dict[str, Any]]:
    return current(tmp_path_factory.mktemp("golden"))


def _golden() -> dict[str, dict[str, Any]]:
    return json.loads(GOLDEN.read_text())["inputs"] if GOLDEN.exists() else {}


def test_the_golden_inputs_fire_every_rule(observed) -> None:
    from toolkit.diagnose.rules import RULES

    fired = {f["id"].split(".", 1)[0] for entry in observed.values() for f in entry["findings"]}
    assert {"crash" if rule == "crashes" else rule for rule in RULES} <= fired


def test_the_golden_inputs_are_the_stored_ones(observed) -> None:
    assert sorted(observed) == sorted(_golden())


@pytest.mark.parametrize("name", sorted(_golden()))
def test_findings_and_command_are_the_golden_ones(observed, name: str) -> None:
    assert observed[name] == _golden()[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="store the current findings as the golden ones")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found = current(Path(folder))
    count = sum(len(entry["findings"]) for entry in found.values())
    print(f"{len(found)} inputs, {count} findings")
    if args.write:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"inputs": found, "counts": {"inputs": len(found), "findings": count}},
                                     indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
