"""Judging from a model of the pool, the running cap and the stop, not from thresholds (issue 49): the shapes of
the whole vLLM-CPU logs that were judged wrong at first contact, built with the log factory."""
from __future__ import annotations

from toolkit.diagnose import analyze

from tests.diagnose.logfactory import VllmLog, vllm_engine_traceback


def _ids(lines: list[str]) -> dict[str, object]:
    return {f.id: f for f in analyze(lines=lines).findings}


def test_a_kv_cache_that_holds_two_requests_is_the_pool_not_the_step_budget() -> None:
    """1,024 tokens, two requests of ~440 running at 85.7 % with 92 waiting for two minutes: usage is below 0.9
    but what is left (~146 tokens) holds no third request."""
    log = VllmLog().start(kv_tokens=1024, max_model_len=4096).stats_series(12, running=2, waiting=92, usage=0.857,
                                                                           gen=20.0)
    found = _ids(log.lines)
    assert "capacity.pool_bound" in found and "usage.low_while_queued" not in found, sorted(found)
    assert "hold 2 requests" in found["capacity.pool_bound"].message  # type: ignore[attr-defined]


def test_a_large_cache_with_room_and_a_queue_is_still_the_step_budget() -> None:
    """The same usage on a cache of 400,000 tokens leaves room for hundreds more: not memory."""
    log = VllmLog().start(kv_tokens=400_000).stats_series(12, running=200, waiting=92, usage=0.857, gen=2000.0)
    found = _ids(log.lines)
    assert "capacity.pool_bound" not in found and "usage.low_while_queued" in found, sorted(found)


def test_a_pool_that_fills_in_waves_is_the_pool_not_the_step_budget() -> None:
    """benchmarks/tune_vs_search on vLLM-CPU with 9 blocks (1,152 tokens): requests of one length finish in the same
    step, so the stats lines alternate between 4 running at 100 % (the pool holds 4 of ~288 tokens) and 2 running at
    50 % with the queue still waiting for the next step's admissions. The room on half the queued lines is the trough
    between waves: tune had asked for --max-num-batched-tokens 16384 and measured no gain."""
    log = VllmLog().start(kv_tokens=1152, max_model_len=1024, num_gpu_blocks_override=9).stats_series(
        16, every=1.0, running=[4, 2], waiting=[12, 10], usage=[1.0, 0.5], gen=60.0)
    found = _ids(log.lines)
    assert "usage.low_while_queued" not in found and "capacity.pool_bound" in found, sorted(found)
    bound = found["capacity.pool_bound"]
    assert bound.flag == "--num-gpu-blocks-override" and int(bound.change.value) > 9  # type: ignore[attr-defined]
    # full on fewer than a third of the queued lines: the room is real, the step budget limits
    rare = VllmLog().start(kv_tokens=1152, max_model_len=1024, num_gpu_blocks_override=9).stats_series(
        16, every=1.0, running=[4, 2, 2, 2], waiting=12, usage=[1.0, 0.5, 0.5, 0.5], gen=60.0)
    assert "usage.low_while_queued" in _ids(rare.lines)


def test_forty_seconds_of_a_pinned_running_cap_is_evidence_at_low_confidence() -> None:
    log = VllmLog().start(max_num_seqs=2).stats_series(4, running=2, waiting=30, usage=0.004, gen=40.0)
    found = _ids(log.lines)
    pinned = found["running_cap.pinned"]
    assert pinned.confidence == "low" and pinned.severity == "info" and pinned.flag == "--max-num-seqs"  # type: ignore[attr-defined]
    assert pinned.evidence.facts["load_seconds"] == 40  # type: ignore[attr-defined]
    two_minutes = _ids(VllmLog().start(max_num_seqs=2).stats_series(12, running=2, waiting=30, usage=0.004,
                                                                     gen=40.0).lines)["running_cap.pinned"]
    assert two_minutes.confidence == "high" and two_minutes.severity == "warning"  # type: ignore[attr-defined]


def test_a_cap_pinned_below_a_hand_set_pool_raises_the_pool_alongside() -> None:
    """benchmarks/tune_vs_search on vLLM-CPU: 2 running (the cap) with 14 waiting at 36 % of a pool capped by hand
    at 12 blocks (1,536 tokens). The pool holds 5 requests of the ~280 tokens these grow to: a cap raised to what it
    supports alone (4, then 5) pins the batch at the pool next (tune stopped there, at 0.75x of random search's
    best); the 16 requests that wanted
    to run get a cap of 16 and a pool that holds them (ceil(12 x 16 x 279.6 / 0.9 / 1,536) = 39 blocks)."""
    def pinned(**start: object):
        log = VllmLog().start(kv_tokens=1536, max_model_len=1024, max_num_seqs=2, **start)  # type: ignore[arg-type]
        return _ids(log.stats_series(12, every=1.0, running=2, waiting=14, usage=0.364, gen=50.0).lines)[
            "running_cap.pinned"]

    hand_set = pinned(num_gpu_blocks_override=12).change  # type: ignore[attr-defined]
    assert (hand_set.idea, hand_set.value) == ("running_cap", "16")
    assert [(c.idea, c.value) for c in hand_set.companions] == [("kv_cap", "39")]
    machine_sized = pinned().change  # type: ignore[attr-defined]
    assert (machine_sized.value, machine_sized.companions) == ("4", ())  # 2 x 0.9 / 0.364: the pool's support


def test_two_stats_lines_are_not_enough_to_judge_a_cap() -> None:
    log = VllmLog().start(max_num_seqs=2).stats_series(2, running=2, waiting=30, usage=0.004, gen=40.0)
    assert "running_cap.pinned" not in _ids(log.lines)


def _stopped_then(log: VllmLog, *lines: str) -> VllmLog:
    log.add("[shutdown] API server: shutdown triggered", dt=1, file="launcher.py:254")
    log.add("[shutdown] EngineCore: trigger received signal=SIGTERM", file="core.py:1454",
            process="EngineCore_DP0", pid=20600)
    log.lines.extend(lines)
    return log


def test_a_clean_stop_and_the_teardown_traceback_after_it_are_not_a_crash() -> None:
    """Ctrl-C / SIGTERM: vLLM's shutdown lines, then the output handler's EngineDeadError."""
    log = VllmLog().start().stats_series(3, running=3, waiting=0, usage=0.01, gen=50.0)
    teardown = ["Traceback (most recent call last):", '  File "/x/vllm/v1/engine/async_llm.py", line 1, in output_handler',
                "    outputs = await engine_core.get_output_async()",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
                "for the root cause."]
    found = _ids(_stopped_then(log, *teardown).lines)
    assert "crash.exception" not in found and found["crash.stopped"].severity == "info", sorted(found)  # type: ignore[attr-defined]
    for stop in ("INFO 01-19 13:55:01 [launcher.py:80] Shutting down FastAPI HTTP server.", "INFO:     Shutting down"):
        plain = VllmLog().start().stats_series(3, running=3, waiting=0, usage=0.01, gen=50.0)
        assert "crash.exception" not in _ids([*plain.lines, stop, *teardown]), stop


def test_a_crash_before_the_stop_is_still_a_crash() -> None:
    log = VllmLog().start().stats_series(3, running=3, waiting=0, usage=0.01, gen=50.0)
    log.lines.extend(vllm_engine_traceback(("core/sched/scheduler.py", "schedule")))
    found = _ids(_stopped_then(log).lines)
    assert found["crash.exception"].severity == "critical" and "crash.stopped" not in found  # type: ignore[attr-defined]


def test_a_log_whose_engine_cannot_be_told_names_both_engines_flags() -> None:
    """Bare batch lines without either engine's start-up or words: the cap is named in both engines' flags."""
    from toolkit.diagnose.findings import Evidence, Finding
    from toolkit.diagnose.rules import _in_both_engines
    from toolkit.diagnose.vocabulary import Change

    finding = Finding(id="running_cap.pinned", severity="warning", title="t", message="m.", evidence=Evidence(),
                      change=Change("running_cap", "8"))
    both = _in_both_engines(finding)
    assert both.flag == "--max-running-requests" and "--max-num-seqs" in both.message
    assert _in_both_engines(Finding(id="x.y", severity="info", title="t", message="m.", evidence=Evidence())).message == "m."


def test_an_sglang_pool_that_holds_two_requests_of_this_size_binds_below_its_usage_threshold() -> None:
    """toolkit serve --max-total-tokens 1024 under 256/128 requests: two run at 53-73 % usage (their reserved
    output counts against the pool), a third does not fit; not the admission's conservativeness."""
    from tests.diagnose.test_rules import Startup, base

    log = base(Startup(max_running=512, max_total=1024)).decode_series(
        12, running=2, usage=[0.58, 0.72, 0.59, 0.73], queue=[60, 80, 100], max_total=1024)
    found = _ids(log.lines)
    assert "capacity.pool_bound" in found and "usage.low_while_queued" not in found, sorted(found)


def test_a_dead_engine_cores_shutdown_lines_are_no_stop_request() -> None:
    """vLLM prints `[shutdown]` lines when its engine core dies too: only the trigger lines ask for a stop."""
    log = VllmLog().start().stats_series(3, running=3, waiting=0, usage=0.01, gen=50.0)
    log.add("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", dt=1, file="core_client.py:817",
            level="WARNING")
    log.lines.extend(["Traceback (most recent call last):", '  File "/x/vllm/v1/engine/async_llm.py", line 1, in h',
                      "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."])
    found = _ids(log.lines)
    assert found["crash.exception"].severity == "critical" and "crash.stopped" not in found, sorted(found)  # type: ignore[attr-defined]


def test_shedding_on_a_cpu_server_asks_for_more_hosts_not_replicas_on_the_same_cores() -> None:
    """recorded/toolkit-shedding-overload: 8 req/s on 2 cores, 503s as configured; a second replica on the same
    CPU would share its cores."""
    from pathlib import Path

    log = Path(__file__).parent / "real_logs" / "recorded" / "toolkit-shedding-overload.log"
    (shed,) = [f for f in analyze([log]).findings if f.id == "shedding.too_much"]
    assert shed.change is None and shed.alternatives == () and "more hosts" in (shed.action or "")


def test_a_pool_capped_by_hand_is_raised_to_hold_the_requests_that_wanted_to_run() -> None:
    """A 1,024-token pool of ~224-token requests holds 4 while 8 wait: the cap grows to the 12 requests' tokens
    (tune stopped at a bare "higher" before: benchmarks/tune_vs_search)."""
    from tests.diagnose.test_rules import Startup, base

    log = base(Startup(max_running=4, max_total=1024), max_total_tokens=1024).decode_series(
        12, running=4, usage=[0.81, 0.88], queue=[8], max_total=1024)
    change = _ids(log.lines)["capacity.pool_bound"].change
    assert change.idea == "kv_cap" and change.direction == 0 and change.companions == ()
    assert 2048 <= int(change.value) <= 3072, change.value  # 12 requests of ~220 tokens, in the cap's tokens
    # a running cap set by hand at what the small pool held comes along: the larger pool alone would change nothing
    capped = base(Startup(max_running=4, max_total=1024), max_total_tokens=1024, max_running_requests=4)
    change = _ids(capped.decode_series(12, running=4, usage=[0.81, 0.88], queue=[8], max_total=1024).lines)[
        "capacity.pool_bound"].change
    (along,) = change.companions
    assert along.idea == "running_cap" and 11 <= int(along.value) <= 12, along  # the 12 that wanted to run


def test_a_full_pool_with_the_memory_fraction_unknown_asks_for_memory_first_unless_little_is_left() -> None:
    """Held-out batch 23 (an SGLang log whose excerpt prints no --mem-fraction-static): a long log full with a queue
    asks for more KV memory (fp8 the alternative) as a short one does; where the start-up shows little memory left
    (`gpu_memory.too_little`), an fp8 KV cache is the step, not more memory."""
    from tests.diagnose.logfactory import Log, Startup

    bare = _ids(Log("0.4.9").decode_series(12, queue=20, usage=0.97).lines)["capacity.pool_bound"]
    assert bare.flag == "--mem-fraction-static" and [a.idea for a in bare.alternatives] == ["kv_dtype"]  # type: ignore[attr-defined]
    tight = Log("0.4.9").start(Startup(available=3.0)).decode_series(12, queue=20, usage=0.97)
    found = _ids(tight.lines)
    assert "gpu_memory.too_little" in found and found["capacity.pool_bound"].flag == "--kv-cache-dtype"  # type: ignore[attr-defined]


def test_a_burst_that_drains_while_the_pool_binds_sizes_the_pool_for_the_burst() -> None:
    """16 requests arrive together at a 1,024-token pool that holds 4: the queue drains 12 -> 2 while the pool binds.
    The median line counts the 8-10 left, not the 16 that came: the cap grows for nearly all of them
    (tune_vs_search's tiny pool sized 2,240 for 10, was bound again, and spent a launch on it)."""
    from tests.diagnose.test_rules import Startup, base

    log = base(Startup(max_running=4, max_total=1024), max_total_tokens=1024).decode_series(
        12, running=4, usage=[0.81, 0.88], queue=[12, 12, 10, 8, 8, 6, 6, 4, 4, 2, 2, 2], max_total=1024)
    change = _ids(log.lines)["capacity.pool_bound"].change
    assert change.idea == "kv_cap" and int(change.value) >= 14 * 220, change.value
