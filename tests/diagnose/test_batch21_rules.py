"""Held-out batch 21's lessons (tests/diagnose/real_logs/README.md, "Held-out batch 21"), each a general rule:

- vLLM V0's scheduler warning `Input prompt (N tokens) is too long and exceeds limit of M` is read
  (`prompt_too_long`), with its start cut to the source tag (`scheduler.py:648] `) too, and
  `prompt_limit.exceeded` (warning) raises the flag that set M, modelled as V0 computes its prompt limit: the max
  model len with chunked prefill, min(max model len, max_num_batched_tokens) without; both flags where the log
  does not show the config;
- a bare `Traceback (most recent call last):` that another exception cuts off at once (no frame, no error line) is
  no record; one the excerpt ends with still is;
- an exception's last line on its own (`RuntimeError: ...`) is the exception's record where the log holds no other
  error record; where it holds one, the line is a fragment of that failure.
"""
from __future__ import annotations

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.lines import LineParser
from toolkit.diagnose.rules.prompt_limit import limit_setters

RULE = "prompt_limit.exceeded"


def _refused(n: int, m: int, head: str = "WARNING 03-01 10:00:00 scheduler.py:900] ") -> str:
    return f"{head}Input prompt ({n} tokens) is too long and exceeds limit of {m}"


def _v0_config(max_seq_len: int, chunked: bool | None = None) -> str:
    """V0's engine config line (0.6's wording: no comma after chunked_prefill_enabled)."""
    chunk = f"chunked_prefill_enabled={chunked} " if chunked is not None else ""
    return ("INFO 03-01 09:59:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: model='m', "
            f"tokenizer='m', dtype=torch.float16, max_seq_len={max_seq_len}, tensor_parallel_size=1, "
            f"pipeline_parallel_size=1, seed=0, served_model_name=m, num_scheduler_steps=1, {chunk}"
            "multi_step_stream_outputs=True, enable_prefix_caching=False")


def _found(lines: list[str]) -> Finding:
    (f,) = [f for f in analyze(lines=lines).findings if f.id == RULE]
    return f


def _raised(f: Finding) -> dict[str, int]:
    """{flag: direction} of the finding's change and alternatives."""
    changes = ([f.change] if f.change else []) + list(f.alternatives)
    out = {}
    for c in changes:
        flag = c.as_flag(f.engine).split()[0]
        out[flag] = c.direction or (1 if f.current is not None and float(str(c.value)) > float(f.current.value)
                                    else 0)
    return out


# -- reading --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    _refused(5000, 4096),
    _refused(5000, 4096, head="scheduler.py:648] "),  # pasted from its source tag on (V0 before 0.7: no `[`)
    _refused(5000, 4096, head="\u201cWARNING 03-01 10:00:00 scheduler.py:947] "),  # after a curly quote
    "`" + _refused(5000, 4096, head="") + "`",  # inline code
    _refused(5000, 4096, head="error: WARNING 03-01 10:00:00 scheduler.py:245] "),  # after the user's label
])
def test_the_prompt_limit_warning_is_read_with_its_numbers(line: str) -> None:
    d = analyze(lines=[line])
    assert d.stats.kinds.get("prompt_too_long") == 1
    (e,) = d.timeline.kind("prompt_too_long")
    assert (e.fields["prompt_len"], e.fields["prompt_limit"]) == (5000, 4096)
    assert d.config.engine == "vllm"  # the wording alone names vLLM


# -- which flag set the limit ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("limit,model_len,budget,chunked,setters", [
    (4096, 4096, None, None, ("context",)),                 # the model len is the limit
    (4096, 4096, 8192, False, ("context",)),                # a budget above it is not the min
    (4096, 4096, 4096, False, ("context", "prefill_budget")),  # both equal it: raising one alone does nothing
    (4096, 4096, 4096, True, ("context",)),                 # chunked prefill lifts the budget
    (2048, 131072, None, None, ("prefill_budget",)),        # only the budget limits below the model len
    (2048, 131072, 2048, True, ("prefill_budget",)),        # chunked prefill asked for and not run (MLA on 0.7)
    (2560, None, 2560, None, ("prefill_budget",)),
    (4096, None, 8192, None, ("context",)),                 # a budget above the limit: the model len is it
    (4096, None, 512, True, ("context",)),                  # chunked prefill on, its budget below: the model len
    (4096, None, None, True, ("context",)),
    (4096, None, None, None, ("context", "prefill_budget")),  # nothing shown: either
    (4096, None, None, False, ("context", "prefill_budget")),
])
def test_the_flag_that_set_the_limit_is_modelled_as_v0_computes_it(limit, model_len, budget, chunked,
                                                                    setters) -> None:
    assert limit_setters(limit, model_len, budget, chunked) == setters


def test_a_limit_at_the_model_len_raises_max_model_len() -> None:
    f = _found([_v0_config(4096, chunked=False), _refused(9000, 4096)])
    assert f.severity == "warning" and f.engine == "vllm"
    assert f.flag == "--max-model-len" and _raised(f) == {"--max-model-len": 1}
    assert "9,000" in f.message and "4,096" in f.message


def test_a_limit_below_the_model_len_raises_the_step_budget_to_the_model_len() -> None:
    f = _found([_v0_config(131072, chunked=True),
                "INFO 03-01 09:59:00 config.py:1000] Chunked prefill is enabled with max_num_batched_tokens=2048.",
                _refused(2501, 2048)])
    assert f.flag == "--max-num-batched-tokens"
    assert f.change is not None and f.change.value == "131072" and _raised(f) == {"--max-num-batched-tokens": 1}


def test_without_the_config_one_finding_names_both_flags_raised() -> None:
    f = _found([_refused(2713, 2560), _refused(3000, 2560)])
    assert {f.flag, *(a.as_flag(f.engine).split()[0] for a in f.alternatives)} == {"--max-model-len",
                                                                                    "--max-num-batched-tokens"}
    assert "--max-num-batched-tokens" in (f.suggested or "")  # the scoring reads the flags the text names
    assert set(_raised(f).values()) == {1}
    assert "3,000" in f.message and "2,560" in f.message and "chunked prefill" in f.message
    assert f.evidence.facts["requests"] == 2


def test_a_dropped_prompt_is_a_problem_not_a_crash() -> None:
    d = analyze(lines=[_refused(2083, 2048)])
    assert not any(f.rule == "crash" for f in d.findings)
    assert any(f.id == RULE and f.severity == "warning" for f in d.findings)


def test_no_prompt_refused_no_finding() -> None:
    assert not [f for f in analyze(lines=[_v0_config(4096)]).findings if f.id == RULE]


# -- a traceback's bare head cut off by another exception ----------------------------------------------------------

FRAMES = ['  File "/srv/app/worker.py", line 244, in step',
          "    self.forward()",
          '  File "/srv/app/worker.py", line 260, in forward']


def test_a_bare_traceback_head_cut_off_by_another_exception_is_no_record() -> None:
    lines = ["Traceback (most recent call last):",
             "[14:47:01 TP0] Exception in WorkerServer:",
             "Traceback (most recent call last):", *FRAMES]
    assert analyze(lines=lines).stats.kinds.get("exception") == 1


def test_a_bare_traceback_head_the_excerpt_ends_with_is_a_record() -> None:
    assert analyze(lines=["INFO 03-01 10:00:00 engine.py:1] started", "Traceback (most recent call last):"]
                   ).stats.kinds.get("exception") == 1


def test_a_traceback_with_frames_cut_by_another_still_counts() -> None:
    lines = ["Traceback (most recent call last):", *FRAMES, "Traceback (most recent call last):", *FRAMES]
    assert analyze(lines=lines).stats.kinds.get("exception") == 2


# -- an exception's last line on its own ---------------------------------------------------------------------------

def test_a_lone_error_line_is_the_exception_and_a_crash() -> None:
    d = analyze(lines=["`RuntimeError: slots run out. Please set a smaller number. available_size()=1, num_reqs=2,",
                       "`"])
    assert d.stats.kinds.get("exception") == 1
    assert any(f.id == "crash.exception" and f.severity == "critical" for f in d.findings)


@pytest.mark.parametrize("line,kind", [
    ("RuntimeError: Decode out of memory. Try to lower your batch size.", "oom"),  # its error kind, as before
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
     "not_enough_memory"),
    ("KeyError: 'model_type'", "exception"),
    ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.", "exception"),
    ("Exception: the worker stopped", "exception"),
])
def test_a_lone_error_line_is_read_as_what_it_names(line: str, kind: str) -> None:
    assert analyze(lines=[line]).stats.kinds.get(kind) == 1


@pytest.mark.parametrize("line", [
    "Error: no such option --foo",  # any program's message, no exception's class
    "UserWarning: TypedStorage is deprecated",  # a warning
    "exception=KVTransferError('bootstrap failed')",  # a repr inside another message
])
def test_lines_that_are_no_exception_s_last_line_are_not_read(line: str) -> None:
    assert not analyze(lines=[line]).stats.kinds.get("exception")


@pytest.mark.parametrize("line", [
    "ERROR 12-02 10:00:05 [serving_chat.py:200] ValueError: This model's maximum context length is 2048 tokens. "
    "However, you requested 3000 tokens.",  # vLLM's logger about a request it answered 400
    "[2026-12-02 10:00:05 TP0] KeyError: 'rid-7'",  # SGLang's
])
def test_a_stamped_error_message_of_a_server_that_serves_on_is_no_crash(line: str) -> None:
    """Python prints an uncaught exception's last line without a stamp; a logger's stamped `ValueError: ...` is a
    message about one request, and the stats lines after it show the server serving on."""
    stats = ("INFO 12-02 10:00:{:02d} [loggers.py:335] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg "
             "generation throughput: 50.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
             "Prefix cache hit rate: 0.0%")
    d = analyze(lines=[stats.format(0), line, stats.format(10)])
    assert not d.stats.kinds.get("exception")
    assert not any(f.id.startswith("crash") for f in d.findings)


def test_a_lone_error_line_beside_a_whole_traceback_is_a_fragment_of_it() -> None:
    tail = "TypeError: '>' not supported between instances of 'NoneType' and 'int'"
    before = ["if x > 0:", tail, "[2025-03-03 06:49:28 TP5] Scheduler hit an exception: Traceback (most recent "
              "call last):", *FRAMES, tail]
    assert analyze(lines=before).stats.kinds.get("exception") == 1
    after = ["[2025-03-03 06:49:28 TP5] Scheduler hit an exception: Traceback (most recent call last):", *FRAMES,
             tail, "[2025-03-03 06:49:30 TP5] Some other line", tail]
    assert analyze(lines=after).stats.kinds.get("exception") == 1


def test_two_lone_error_lines_alone_are_two_records() -> None:
    assert analyze(lines=["RuntimeError: first", "INFO 03-01 10:00:00 a.py:1] between", "RuntimeError: second"]
                   ).stats.kinds.get("exception") == 2


def test_a_lone_error_line_does_not_swallow_the_traceback_after_it() -> None:
    """vLLM prints each traceback line with its prefix; a dotted error line its record's continuation missed is
    no record of its own, and the next traceback is one."""
    head = "ERROR 03-01 10:00:00 serving.py:500] "
    block = [head + "Traceback (most recent call last):", *(head + f for f in FRAMES),
             head + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
             head + "Error in completion stream generator."]
    assert analyze(lines=block * 3).stats.kinds.get("exception") == 3


def test_lone_lines_are_held_until_the_source_ends_and_kept_in_line_order() -> None:
    parser = LineParser()
    assert parser.feed(["RuntimeError: first", "INFO 03-01 10:00:00 a.py:1] between"]) == []
    events = parser.finish()
    assert [(e.kind, e.line) for e in events] == [("exception", 1)]


def test_v0_engine_config_items_glued_without_a_comma_are_read_apart() -> None:
    from toolkit.diagnose.read.arguments import _engine_config

    fields = _engine_config(_v0_config(4096, chunked=False).partition("] ")[2])
    assert fields["chunked_prefill_enabled"] is False and fields["multi_step_stream_outputs"] is True
