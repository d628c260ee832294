"""Held-out batch 22's lessons (tests/diagnose/real_logs/README.md, "Held-out batch 22"), each a general rule:

- an error line that names its cause (an OOM, no memory for the KV cache) glued to the user's own words before it
  (`...报错ValueError: The model's max seq len ...`) is read; an error named inside prose (after a space or a
  quote) is not;
- an error message that a paste wrapped mid-sentence goes on over its wrapped lines, and vLLM's argument names in
  it (`max_num_seqs`, `gpu_memory_utilization`) tell the engine where no other line does: the advice is in vLLM's
  flags;
- vLLM's `EngineCore failed to start` with no error line, right after a start-up line that left no memory for the
  KV cache, is that refusal (a problem of the launch the start-up rule explains), not a crash.
"""
from __future__ import annotations

from toolkit.diagnose import analyze

REFUSAL = ("ValueError: The model's max seq len (1024) is larger than the maximum number of tokens that can be "
           "stored in KV cache (464). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
           "initializing the engine.")


def _read(lines: list[str], kind: str) -> int:
    return len(analyze(lines=lines).timeline.kind(kind))


def test_an_error_glued_to_the_users_words_is_read_and_one_named_in_prose_is_not():
    assert _read([f"使用2*A00环境，报错{REFUSAL}"], "not_enough_memory") == 1
    assert _read([f"my label:{REFUSAL}"], "not_enough_memory") == 1
    assert _read([f'the issue ends in "{REFUSAL}"'], "not_enough_memory") == 0
    assert _read([f"the issue ends in {REFUSAL}"], "not_enough_memory") == 0
    assert _read(["I saw a ValueError: in my script"], "exception") == 0


def test_a_wrapped_oom_naming_vllms_arguments_gets_vllms_flags():
    d = analyze(lines=["RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 ",
                       "dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` ",
                       "when initializing the engine."])
    assert len(d.timeline.kind("oom")) == 1 and d.config.engine == "vllm"
    (oom,) = [f for f in d.findings if f.id.startswith("oom.")]
    assert oom.flag == "--gpu-memory-utilization" and "--mem-fraction-static" not in (oom.suggested or "")
    # the same error unwrapped on one line of an SGLang-less log: the same engine
    one_line = analyze(lines=["RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
                              "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization`."])
    assert one_line.config.engine == "vllm"


def test_a_failed_start_after_no_kv_memory_is_the_refusal_not_a_crash():
    lines = ["(EngineCore_0 pid=1321) INFO 09-06 03:10:08 [gpu_worker.py:276] Available KV cache memory: -0.53 GiB",
             "(EngineCore_0 pid=1321) ERROR 09-06 03:10:08 [core.py:700] EngineCore failed to start."]
    ids = {f.id for f in analyze(lines=lines).findings}
    assert "oom.startup" in ids and "crash.exception" not in ids
    # with memory for the cache, the same failed start is a crash
    healthy_memory = [lines[0].replace("-0.53", "11.03"), lines[1]]
    assert "crash.exception" in {f.id for f in analyze(lines=healthy_memory).findings}
