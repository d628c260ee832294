"""Held-out batch 24's lessons (tests/diagnose/real_logs/README.md, "Held-out batch 24"), each a general rule:

- an engine message that names its cause, right after a logger's bracketed field in a format no prefix form reads
  (Xinference's `... ERROR    [address=..., pid=167] The model's max seq len ...`), is read; the same words in prose
  are not;
- a whole line pasted in backticks that holds inline code of its own (`` ` vllm-1  | ValueError: ... `gpu_memory_
  utilization` ...` ``) is the line inside the outer pair;
- an error class named at the end of a dotted path in prose (`its torch.OutOfMemoryError: ...`) is not an error
  line glued to a label;
- a PD prefill server prints no decode line: its prefill lines say whether the pool ever held a request back, and
  idle memory under a load that never waited is info without a flag;
- vLLM's `max_num_scheduled_tokens is set to N based on the speculative decoding settings` is the step budget now:
  a step-budget finding says so and moves the budget up from it;
- vLLM refusing a hybrid model's start at more running requests than state cache blocks asks for a running cap of
  at most that many blocks (or more memory).
"""
from __future__ import annotations

from toolkit.diagnose import analyze

REFUSAL = ("The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache "
           "(17744). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
           "engine.")


def _kinds(lines: list[str], kind: str) -> int:
    return len(analyze(lines=lines).timeline.kind(kind))


def test_a_cause_named_after_a_loggers_bracketed_field_is_read_and_in_prose_is_not():
    logged = f"2025-04-12 21:57:39,467 xinference.api.restful_api 1 ERROR    [address=0.0.0.0:43423, pid=167] {REFUSAL}"
    d = analyze(lines=[logged])
    assert len(d.timeline.kind("not_enough_memory")) == 1
    (refused,) = [f for f in d.findings if f.id == "oom.startup"]
    assert refused.flag == "--max-model-len"
    assert _kinds([f"the thread says {REFUSAL}"], "not_enough_memory") == 0
    assert _kinds([f"[quote] Hello there, {REFUSAL}"], "not_enough_memory") == 0


def test_a_line_in_backticks_with_inline_code_of_its_own_is_the_line_inside():
    line = f"` vllm-1  | ValueError: {REFUSAL}`"
    assert _kinds([line], "not_enough_memory") == 1
    assert _kinds([f"`{REFUSAL}` and more words after it"], "not_enough_memory") == 0


def test_an_error_class_at_the_end_of_a_dotted_path_in_prose_is_no_error_line():
    prose = "# what: the traceback's last frames and its torch.OutOfMemoryError: 15.34 GiB in use of 15.47 GiB"
    assert _kinds([prose], "oom") == 0
    assert _kinds(["报错OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB."], "oom") == 1


def _prefill_server(queue: int, usage: float) -> list[str]:
    pool = ("[2026-02-06 12:20:03 DP0 TP0 EP0] max_total_num_tokens=1000000, chunked_prefill_size=16384, "
            "max_prefill_tokens=16384, max_running_requests=64, context_len=8192, available_gpu_mem=23.31 GB")
    lines = [pool]
    for i in range(12):
        lines.append(f"[2026-02-06 12:28:{10 + i:02d} DP0 TP0 EP0] Prefill batch, #new-seq: 2, #new-token: 7168, "
                     f"#cached-token: 0, token usage: {usage:.2f}, #running-req: 0, #queue-req: {queue}, ")
    return lines


def test_a_prefill_servers_idle_memory_under_a_load_that_never_waited_names_no_flag():
    (idle,) = [f for f in analyze(lines=_prefill_server(queue=0, usage=0.03)).findings if f.id == "gpu_memory.too_much"]
    assert idle.severity == "info" and idle.change is None
    # requests waiting at a full pool: the memory is wanted
    (wanted,) = [f for f in analyze(lines=_prefill_server(queue=5, usage=0.99)).findings
                 if f.id == "gpu_memory.too_much"]
    assert wanted.severity == "warning" and wanted.flag == "--mem-fraction-static"


def test_speculative_decodings_cut_of_the_step_budget_is_the_budget_now():
    warning = ("(APIServer pid=1) WARNING 08-21 10:30:00 [vllm.py:1648] max_num_scheduled_tokens is set to 2048 based "
               "on the speculative decoding settings. This may lead to suboptimal performance.")
    stats = [f"(APIServer pid=1) INFO 08-21 10:{31 + i // 6:02d}:{(i % 6) * 10:02d} [loggers.py:273] Engine 000: Avg "
             f"prompt throughput: 4448.4 tokens/s, Avg generation throughput: 14.5 tokens/s, Running: 2 reqs, "
             f"Waiting: 3 reqs, GPU KV cache usage: 1.5%, Prefix cache hit rate: 0.0%" for i in range(14)]
    d = analyze(lines=[warning, *stats])
    assert d.config.scheduled_tokens == 2048
    (budget,) = [f for f in d.findings if f.id == "usage.low_while_queued"]
    assert budget.flag == "--max-num-batched-tokens" and budget.current.value == 2048
    assert int(budget.change.value) > 2048


def test_more_running_requests_than_state_blocks_asks_for_a_cap_within_them():
    d = analyze(lines=["ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (524)"])
    assert len(d.timeline.kind("not_enough_memory")) == 1 and d.config.engine == "vllm"
    (refused,) = [f for f in d.findings if f.id == "oom.startup"]
    assert refused.flag == "--max-num-seqs" and refused.change.value == "524" and refused.current.value == 1024
    assert "crash.exception" not in {f.id for f in d.findings}
