"""Held-out batch 20's lessons (tests/diagnose/real_logs/README.md, "Held-out batch 20"), each a general rule:

- `speculative.batch_compute_bound`: speculative decoding on a batch whose verify step is compute-bound (running x
  (k + 1) tokens per step past `COMPUTE_BOUND_TOKENS`), where a step yields only L of its k + 1 tokens;
- a line behind one of vLLM's own process names (`(EngineCore pid=N)`) with no logger stamp after it names vLLM;
- an alternative memory fraction moves by a value only from a fraction the log states (from a default: a direction);
- V0's `Writing input of failed execution to ...` (printed only where `execute_model` raised) opens an exception;
- SGLang's `cap len` is a number printed with decimals (`cap len: 6.00`).
"""
from __future__ import annotations

import pytest

from tests.diagnose.logfactory import VllmLog, vllm_stats
from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.prefix import read_prefix
from toolkit.diagnose.rules.speculative import COMPUTE_BOUND_TOKENS, NEAR_FULL

BATCH_RULE = "speculative.batch_compute_bound"


def _record(length: float, k: int, drafted: int = 4000) -> str:
    """A V1 SpecDecoding record whose counts make k = (length - 1) / rate draft positions."""
    rate = (length - 1) / k
    return (f"SpecDecoding metrics: Draft acceptance rate: {100 * rate:.1f}%, Mean acceptance length: {length:.2f}, "
            f"Accepted: {round(rate * drafted)} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: 0.6")


def _spec_log(running: list[int], length: float, k: int) -> list[str]:
    log = VllmLog().start()
    for r in running:
        log.add(vllm_stats(running=r, waiting=0, usage=0.2, gen=3000.0), dt=10)
        log.add(_record(length, k), file="metrics.py:86")
    return log.lines


def _batch(lines: list[str]) -> list[Finding]:
    return [f for f in analyze(lines=lines).findings if f.id == BATCH_RULE]


@pytest.mark.parametrize("running,length,k,fires", [
    ([600, 610], 2.3, 3, True),     # 600 x 4 = 2,400 tokens a step, 2.3 of 4 kept
    ([400, 420], 2.3, 3, True),     # 1,600 tokens a step: past the compute-bound point
    ([200, 210], 2.3, 3, False),    # 800 tokens a step: still weight-read-bound, speculation pays
    ([600], 2.3, 3, False),         # one record is not enough to judge
    ([600, 610], 3.7, 3, False),    # 3.7 of 4 kept: speculation loses little
])
def test_speculation_on_a_compute_bound_batch_is_found(running: list[int], length: float, k: int,
                                                       fires: bool) -> None:
    found = _batch(_spec_log(running, length, k))
    assert bool(found) is fires, found
    if fires:
        f = found[0]
        assert f.severity == "warning"
        assert f.flag == "--speculative-config.num_speculative_tokens"
        assert f.change is not None and int(str(f.change.value)) < k  # fewer drafts than now
        assert f.evidence.facts["draft_tokens"] == k  # k read from the records: (L - 1) / rate


def test_the_thresholds_are_what_the_model_says() -> None:
    assert 256 < COMPUTE_BOUND_TOKENS <= 4096  # past a dense model's ridge (a few hundred tokens), well short of MoE's
    assert 0.5 < NEAR_FULL < 1


def test_a_record_without_its_stats_line_is_not_judged() -> None:
    log = VllmLog().start()
    for _ in range(3):
        log.add(_record(2.3, 3), dt=10, file="metrics.py:86")
    assert not _batch(log.lines)


@pytest.mark.parametrize("line,vllm", [
    ("(EngineCore pid=112) torch.OutOfMemoryError: CUDA out of memory.", True),
    ("(EngineCore_DP0 pid=7) Traceback (most recent call last):", True),
    ("(VllmWorker TP0 pid=3) ValueError: x", True),
    ("(Worker_TP0_EP0 pid=245) RuntimeError: x", True),
    ("(WorkerDict pid=12) torch.OutOfMemoryError: x", False),  # verl's Ray actor: not vLLM's process
    ("(MyActor pid=3) x", False),
])
def test_a_vllm_process_name_alone_names_the_engine(line: str, vllm: bool) -> None:
    assert read_prefix(line).vllm is vllm


def test_an_oom_behind_the_engine_core_name_alone_gets_vllm_flags() -> None:
    line = ("(EngineCore pid=112) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB. GPU 0 has "
            "a total capacity of 23.56 GiB of which 122.56 MiB is free. Including non-PyTorch memory, this process has "
            "23.42 GiB memory in use.")
    d = analyze(lines=[line])
    flags = {f.flag for f in d.findings if f.flag}
    assert "--gpu-memory-utilization" in flags and "--mem-fraction-static" not in flags


REFUSAL = ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
           "in KV cache (3792). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
           "initializing the engine.")


def _memory_alternative(lines: list[str]):
    f = next(f for f in analyze(lines=lines).findings if f.id == "oom.startup")
    return next(c for c in f.alternatives if c.idea == "kv_memory")


def test_an_alternative_fraction_from_the_default_says_only_which_way() -> None:
    alt = _memory_alternative([REFUSAL])
    assert alt.value is None and alt.direction == 1


def test_an_alternative_fraction_from_the_log_keeps_its_value() -> None:
    launch = "vllm serve Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization 0.8"
    alt = _memory_alternative([launch, REFUSAL])
    assert alt.value == "0.85" and alt.direction == 0


FAILED_EXECUTION = ("INFO 10-11 06:51:31 model_runner_base.py:120] Writing input of failed execution to "
                    "/tmp/err_execute_model_input_20241011-065131.pkl...")


def test_v0_failed_execution_dump_is_a_crash() -> None:
    d = analyze(lines=[FAILED_EXECUTION])
    assert d.stats.kinds.get("exception") == 1
    assert any(f.id == "crash.exception" and f.severity == "critical" for f in d.findings)


def test_the_dump_its_warnings_and_the_traceback_after_it_are_one_record() -> None:
    lines = [FAILED_EXECUTION,
             "WARNING 10-11 06:51:31 model_runner_base.py:143] Failed to pickle inputs of failed execution: Can't "
             "get local object 'weak_bind.<locals>.weak_bound'",
             "ERROR 10-11 06:51:31 engine.py:135] Traceback (most recent call last):",
             'ERROR 10-11 06:51:31 engine.py:135]   File "/usr/vllm/worker/model_runner_base.py", line 116, in _wrapper',
             "ERROR 10-11 06:51:31 engine.py:135]     return func(*args, **kwargs)",
             "ERROR 10-11 06:51:31 engine.py:135] RuntimeError: Error in model execution: boom"]
    assert analyze(lines=lines).stats.kinds.get("exception") == 1


def test_sglang_cap_len_with_decimals_is_read_as_a_number() -> None:
    line = ("[2026-08-15 05:37:25 TP0] Decode batch, #running-req: 1, #full token: 512, full token usage: 0.00, "
            "#swa token: 512, swa token usage: 0.00, accept len: 4.22, accept rate: 0.65, cap len: 6.00, cuda graph: "
            "True, gen throughput (token/s): 3.08, #queue-req: 0")
    d = analyze(lines=[line])
    assert d.stats.kinds.get("decode") == 1


DEAD = "CRITICAL 02-10 18:06:30 launcher.py:101] MQLLMEngine is already dead, terminating server process"
OOM_REPR = ("ERROR 02-10 18:06:30 engine.py:139] OutOfMemoryError('CUDA out of memory. Tried to allocate 1.27 GiB. GPU 0 "
            "has a total capacity of 79.33 GiB of which 109.81 MiB is free.')")


def test_v0_engine_dead_is_a_crash_even_where_an_oom_explains_it() -> None:
    d = analyze(lines=["INFO 02-10 18:06:30 engine.py:275] Added request cmpl-1.", DEAD,
                       'INFO:     10.25.164.34:57224 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error', OOM_REPR])
    ids = {f.id: f for f in d.findings}
    assert ids["crash.exception"].severity == "critical" and ids["crash.exception"].change is None
    assert ids["oom.other"].flag == "--gpu-memory-utilization"  # the OOM's own rule still advises


def test_an_oom_alone_is_no_crash_finding() -> None:
    assert not any(f.id.startswith("crash.") for f in analyze(lines=[OOM_REPR]).findings)
