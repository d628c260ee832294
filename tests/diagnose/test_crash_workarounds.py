"""A crash whose traceback names its cause carries the workaround an operator tries first (diagnose/rules/
workarounds.py): `--disable-overlap-schedule` for SGLang's overlap path, dropping vLLM's `--async-scheduling` for
its async path, the same `--tp-size` on both sides of a PD set-up; and preemption findings speak the engine's
word (vLLM: preempted, SGLang: retracted)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup, VllmLog
from toolkit.diagnose import analyze
from toolkit.diagnose.vocabulary import Change
from toolkit.diagnose.read.lines import parse_lines

REAL = Path(__file__).parent / "real_logs"


def _crash(log_lines: list[str]):
    d = analyze(lines=log_lines)
    return next(f for f in d.findings if f.id == "crash.exception"), d


def _sglang(message: str, **args: object) -> list[str]:
    return Log("0.5.4").start(Startup(), model_path="m", **args).decode_series(5).add(message, dt=1).lines


# -- SGLang's overlap scheduler ------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [(), ("resolve_last_batch_result",), ("forward_thread_func_",)])
def test_a_crash_raised_in_the_overlap_loop_advises_disabling_overlap(frames) -> None:
    f, d = _crash(_sglang(lf.scheduler_traceback("event_loop_overlap", frames=frames)))
    assert f.severity == "critical" and f.change == Change("overlap_off", True)
    assert f.flag == "--disable-overlap-schedule" and f.current == "overlap on"
    assert "event_loop_overlap" in f.evidence.facts["frames"] and "overlap scheduler" in f.message
    assert "slower" in f.tradeoff and "a few %" in f.tradeoff and f.evidence.lines
    assert d.command.endswith("--disable-overlap-schedule")


def test_a_crash_in_the_normal_loop_gets_no_overlap_advice() -> None:
    f, d = _crash(_sglang(lf.scheduler_traceback("event_loop_normal")))
    assert f.change is None and "frames" not in f.evidence.facts
    assert "--disable-overlap-schedule" not in d.command


def test_overlap_already_off_is_not_advised_again() -> None:
    f, _ = _crash(_sglang(lf.scheduler_traceback("event_loop_overlap"), disable_overlap_schedule=True))
    assert f.change is None


def test_real_crash_in_the_normal_loop_gets_no_overlap_advice() -> None:
    d = analyze([REAL / "sglang" / "sglang-16067-mamba-leak-exception.log"])
    f = next(f for f in d.findings if f.id == "crash.exception")
    assert "run_scheduler_process" in (REAL / "sglang" / "sglang-16067-mamba-leak-exception.log").read_text()
    assert f.change is None


@pytest.mark.parametrize("name", ["vllm/vllm-14574-v1-ci-enginecore-exception",
                                  "vllm/vllm-17939-v1-workerproc-exception-after-graphs",
                                  "vllm/vllm-22702-v1-ray-actor-enginecore-exception",
                                  "sglang/sglang-1751-graph-capture-traceback"])
def test_real_crashes_off_the_overlap_and_async_paths_get_no_scheduling_advice(name) -> None:
    d = analyze([REAL / f"{name}.log"])
    ideas = {f.change.idea for f in d.findings if f.change is not None}
    assert not ideas & {"overlap_off", "async_scheduling", "tp"}


# -- vLLM V1's async scheduling ------------------------------------------------------------------------------

_ASYNC_PATH = (("engine/core.py", "step_with_batch_queue"), ("core/sched/async_scheduler.py", "_update_after_schedule"))


def _vllm(args: dict, frames: tuple[tuple[str, str], ...]) -> list[str]:
    log = VllmLog().add(f"non-default args: {({'model': 'Qwen/Qwen3-8B', **args})!r}", file="utils.py:233")
    log.stats_series(3, running=4, waiting=0, usage=0.1, gen=100.0)
    for line in lf.vllm_engine_traceback(*frames):
        log.add(line, process="EngineCore_DP0", level="ERROR", file="core.py:710")
    return log.lines


def test_a_vllm_crash_on_the_async_path_advises_dropping_async_scheduling() -> None:
    f, _ = _crash(_vllm({"async_scheduling": True}, _ASYNC_PATH))
    assert f.engine == "vllm" and f.change == Change("async_scheduling", False)
    assert f.advice() == ("change", "--async-scheduling remove (synchronous scheduling)")
    assert f.evidence.facts["frames"] == "step_with_batch_queue, async_scheduler.py" and "slower" in f.tradeoff


@pytest.mark.parametrize(("args", "frames"), [({}, _ASYNC_PATH), ({"async_scheduling": True}, ())])
def test_no_async_advice_without_the_flag_in_the_args_or_the_frames(args, frames) -> None:
    f, _ = _crash(_vllm(args, frames))
    assert f.change is None


# -- PD disaggregation with different TP sizes ---------------------------------------------------------------

def test_a_pd_tp_size_mismatch_advises_the_same_tp_size_or_an_upgrade() -> None:
    f, _ = _crash(_sglang(lf.pd_tp_error(), tp_size=4, disaggregation_mode="prefill"))
    assert f.change == Change("tp") and f.flag == "--tp-size" and f.current == "4"
    assert f.evidence.facts["prefill_tp"] == 4 and f.evidence.facts["decode_tp"] is None
    assert f.action.startswith("run prefill and decode with the same --tp-size (now prefill TP 4)")
    assert "upgrade SGLang" in f.action and "different TP sizes" in f.message


def test_a_pd_error_naming_both_sizes_names_both_and_sets_this_side() -> None:
    error = "prefill_tp_size=4 does not match decode_tp_size=2 in disaggregation"
    f, d = _crash(_sglang(lf.pd_tp_error(error), tp_size=4, disaggregation_mode="prefill"))
    assert f.change == Change("tp", "2") and f.current == "4"
    assert "(now prefill TP 4 and decode TP 2)" in f.action and "--tp-size 2" in d.command


def test_a_pd_error_on_the_overlap_path_is_advised_as_a_tp_mismatch() -> None:
    tb = lf.scheduler_traceback("event_loop_overlap_disagg_prefill", "RuntimeError: PD Disaggregation does NOT "
                                "support PD different TP sizes for hybrid mamba models yet.")
    f, _ = _crash(_sglang(tb))
    assert f.change == Change("tp") and f.current is None


def test_an_unrelated_crash_gets_no_tp_advice() -> None:
    f, _ = _crash(_sglang(lf.scheduler_traceback("event_loop_normal", "AssertionError: bad batch")))
    assert f.change is None and f.action is None


# -- preemption in the engine's own word ----------------------------------------------------------------------

def test_v1_resumed_preemptions_are_preemptions_in_vllm_words() -> None:
    log = VllmLog().start().stats_series(30, running=200, waiting=10, usage=0.99, gen=3000.0)
    for i in range(6):
        log.add(lf.vllm_resumed(f"cmpl-{i}-0"), dt=5, process="EngineCore_DP0", file="scheduler.py:495")
    d = analyze(lines=log.lines)
    assert d.stats.kinds["preempt"] == 6
    f = next(f for f in d.findings if f.id == "retraction.frequent")
    assert f.title == "Frequent preemptions" and "6 preemptions" in f.message and "preempted" in f.message
    assert "retract" not in (f.title + f.message).lower()


def test_v0_and_v1_preemption_lines_are_both_read() -> None:
    v0 = ("WARNING 08-20 10:18:39 scheduler.py:1141] Sequence group 147 is preempted by PreemptionMode.RECOMPUTE "
          "mode because there is not enough KV cache space.")
    v1 = "INFO 08-21 07:17:09 [scheduler.py:495] " + lf.vllm_resumed("cmpl-e595-0")
    assert analyze(lines=[v0, v1]).stats.kinds["preempt"] == 2
    real = analyze([REAL / "downstream" / "lmcache-1361-v1-preempted-resumed.log"])
    assert real.stats.kinds["preempt"] == 2


def test_sglang_retractions_stay_retractions() -> None:
    log = Log("0.4.9").start(Startup(), model_path="m")
    for _ in range(10):
        log.decode_series(3).add(lf.retract("0.4.9", k=2, old=0.7, new=0.9), dt=1)
    f = next(f for f in analyze(lines=log.lines).findings if f.id == "retraction.frequent")
    assert "retraction" in (f.title + f.message).lower() and "preempt" not in (f.title + f.message).lower()


@pytest.mark.parametrize(("engine", "words"), [("vllm", "preempt"), ("sglang", "retract")])
def test_the_fleet_finding_speaks_the_engine_word(engine, words) -> None:
    from toolkit.diagnose.fleet import WorkerLoad, _retracting

    hot = WorkerLoad("hot", 30, running=100, usage=0.95, retractions=6, retraction_rate=3.0)
    calm = WorkerLoad("calm", 30, running=10, usage=0.2)
    (f,) = _retracting([hot, calm], engine)
    other = {"preempt": "retract", "retract": "preempt"}[words]
    assert words in f.title and words in f.message and other not in (f.title + f.message)


# -- a crash whose cause another rule explains ---------------------------------------------------------------

DECODE_OOM = "Decode out of memory. Try to lower your batch size.\nTry to allocate 168 tokens.\nAvailable tokens: 3200"


def _cut(traceback: str) -> str:
    """The traceback without its error line (an excerpt cut there, sglang-jax#622)."""
    return traceback.rsplit("\n", 1)[0]


@pytest.mark.parametrize("between,cut,explained", [(0, True, True), (7, True, True), (8, True, False),
                                                   (0, False, False)])
def test_a_cut_traceback_right_after_an_oom_message_is_the_oom(between: int, cut: bool, explained: bool) -> None:
    """SGLang prints `Decode out of memory` and then the scheduler's traceback that raises it: where the log does
    not show the traceback's error line, the OOM finding tells the cause (fewer running requests), not a crash
    with the overlap workaround. More than 10 lines after the OOM's first (its 3 lines, then 8 others), or a
    traceback whose own error line names another error (an illegal memory access), is a crash of its own."""
    log = Log("0.5.4").start(Startup(), model_path="m").decode_series(5).add(DECODE_OOM, dt=1)
    for _ in range(between):
        log.add("Cache flushed successfully!")
    traceback = lf.scheduler_traceback("event_loop_overlap")
    d = analyze(lines=log.add(_cut(traceback) if cut else traceback).lines)
    ids = [f.id for f in d.findings]
    assert "oom.decode" in ids and ("crash.exception" not in ids) is explained
    if explained:
        assert "--disable-overlap-schedule" not in (d.command or "")


def test_an_oom_record_right_after_a_traceback_is_its_cause() -> None:
    """`torch.OutOfMemoryError: CUDA out of memory` opens a record of its own right after the frames above it."""
    error = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    d = analyze(lines=_sglang(lf.scheduler_traceback("event_loop_overlap", error=error)))
    assert [f.id for f in d.findings if f.severity == "critical"] == ["oom.other"]


@pytest.mark.parametrize("error,oom", [
    # https://github.com/sgl-project/sglang/issues/4547: the overlap thread's stream switch
    ("RuntimeError: CUDA error: out of memory", True),
    # https://github.com/gpustack/gpustack/issues/4761: torch_npu's wording
    ("RuntimeError: NPU out of memory. Tried to allocate 48.55 GiB (NPU 1; 60.96 GiB total capacity)", True),
    ("RuntimeError: XPU out of memory. Tried to allocate 2.00 GiB", True),
    # https://github.com/noonghunna/club-3090/issues/60: the driver's wording
    ("torch.AcceleratorError: CUDA driver error: out of memory", True),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", False),
    ("RuntimeError: host out of memory budget exceeded", False),
])
def test_each_devices_out_of_memory_error_ends_a_traceback_as_an_oom(error: str, oom: bool) -> None:
    """A traceback whose error line names a device's out-of-memory is an OOM (its rule advises); any other error
    stays a crash."""
    d = analyze(lines=_sglang(lf.scheduler_traceback("event_loop_overlap", error=error)))
    assert (d.stats.kinds.get("oom", 0) == 1) is oom
    assert ("oom.other" in {f.id for f in d.findings}) is oom


def test_an_oom_in_another_log_does_not_explain_a_traceback(tmp_path) -> None:
    """Two logs: an OOM at line 14 of one is no cause of a traceback at line 15 of the other."""
    oom = tmp_path / "a.log"
    oom.write_text("\n".join(Log("0.5.4").start(Startup(), model_path="m").decode_series(5).add(DECODE_OOM, dt=1)
                             .lines) + "\n")
    crash = tmp_path / "b.log"
    crash.write_text("\n".join(Log("0.5.4").start(Startup(), model_path="m").decode_series(5)
                               .add("Cache flushed successfully!").add(_cut(lf.scheduler_traceback())).lines) + "\n")
    assert {"crash.exception", "oom.decode"} <= {f.id for f in analyze([oom, crash]).findings}


def test_an_oom_message_on_another_rank_does_not_explain_a_traceback() -> None:
    log = Log("0.5.4", lf.Rank(tp=0, tp_size=2)).start(Startup(), model_path="m").decode_series(5)
    log.add(DECODE_OOM, dt=1, rank=lf.Rank(tp=1, tp_size=2))
    d = analyze(lines=log.add(_cut(lf.scheduler_traceback("event_loop_overlap"))).lines)
    assert {"oom.decode", "crash.exception"} <= {f.id for f in d.findings}


def test_a_traceback_ending_in_a_failed_graph_capture_advises_graph_sizes_not_overlap() -> None:
    """sgl-project/sglang#5285: the start-up traceback runs through tp_worker_overlap_thread.py and ends in
    `Exception: Capture cuda graph failed: CUDA out of memory`."""
    d = analyze([REAL / "sglang" / "sglang-5285-graph-capture-oom.log"])
    (f,) = d.findings
    assert f.id == "crash.graph_capture" and f.flag == "--cuda-graph-max-bs"
    assert f.alternatives == (Change("kv_memory", direction=-1), Change("graphs_off", True))
    assert "--mem-fraction-static lower" in (f.suggested or "") and d.stats.kinds["graph_failed"] == 1
    error = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB."
    synthetic = analyze(lines=_sglang(lf.scheduler_traceback("event_loop_overlap", error=error)))
    assert [f.id for f in synthetic.findings if f.severity == "critical"] == ["crash.graph_capture"]


# -- a crash inside CUDA graph capture, its cause not named ---------------------------------------------------

def _capture_traceback(function: str, error: str | None) -> str:
    """SGLang's start-up traceback through the graph runner's `function` (0.3's form: `Exception in run_tp_server`),
    cut before its error line where `error` is None."""
    src = "/sgl-workspace/sglang/python/sglang/srt/model_executor"
    lines = ["Exception in run_tp_server:", "Traceback (most recent call last):",
             f'  File "{src}/cuda_graph_runner.py", line 147, in {function}', "    self.capture()"]
    return "\n".join(lines + ([error] if error else []))


@pytest.mark.parametrize("function,error,advised", [
    ("__init__", None, True),  # sglang#1479: cut before its error line
    ("capture_one_batch_size", "RuntimeError: CUDA error: operation not permitted when stream is capturing", True),
    ("replay", "RuntimeError: CUDA error: an illegal memory access was encountered", False),  # at run time
])
def test_a_crash_while_graphs_are_captured_advises_running_without_them(function: str, error: str | None,
                                                                       advised: bool) -> None:
    f, d = _crash(_sglang(_capture_traceback(function, error)))
    assert (f.change == Change("graphs_off", True)) is advised
    if advised:
        assert f.flag == "--disable-cuda-graph" and "CUDA graph capture (cuda_graph_runner.py)" in f.message
        assert "slower" in f.tradeoff and d.command.endswith("--disable-cuda-graph")


def test_graphs_already_off_are_not_advised_off_again() -> None:
    f, _ = _crash(_sglang(_capture_traceback("__init__", None), disable_cuda_graph=True))
    assert f.change is None


def test_a_vllm_crash_in_capture_model_advises_eager_mode() -> None:
    log = VllmLog().start()
    log.add("EngineCore failed to start.", dt=1, file="core.py:600", level="ERROR")
    for text in ["Traceback (most recent call last):",
                 '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 300, in '
                 "compile_or_warm_up_model", "    self.model_runner.capture_model()",
                 "RuntimeError: CUDA error: operation not permitted when stream is capturing"]:
        log.add(text, file="core.py:600", level="ERROR")
    f, _ = _crash(log.lines)
    assert f.change == Change("graphs_off", True) and f.flag == "--enforce-eager"


def test_the_held_out_capture_crash_of_sglang_1479_gets_graphs_off() -> None:
    """sgl-project/sglang#1479 (held-out batch 5): eight ranks begin capture with ~18.6 GB free, TP4 raises in
    cuda_graph_runner's __init__ (the error line cut)."""
    d = analyze([REAL / "sglang" / "sglang-1479-dsv25-tp8-capture-exception.log"])
    f = next(f for f in d.findings if f.id == "crash.exception")
    assert f.flag == "--disable-cuda-graph" and f.evidence.facts["frames"] == "cuda_graph_runner.py"


# -- preemptions: a few are occasional ----------------------------------------------------------------------

PREEMPTED = ("Sequence group {n} is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
             "space. This can affect the end-to-end performance. Increase gpu_memory_utilization or "
             "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={n}")


@pytest.mark.parametrize("counters,frequent", [((1, 1), False), ((1, 2), True)])
def test_preemptions_of_two_engines_are_each_engines_own(counters: tuple[int, int], frequent: bool) -> None:
    """rllm-org/rllm#93: two Ray workers' engines print under one prefix; `total_num_cumulative_preemption=1`
    twice is one preemption on each (occasional), 1 then 2 is two on one engine within a minute (frequent)."""
    log = VllmLog()
    for n in counters:
        log.add(PREEMPTED.format(n=n), dt=20, level="WARNING", file="scheduler.py:1484")
    d = analyze(lines=log.lines)
    assert any(f.id == "retraction.frequent" for f in d.findings) is frequent
    assert frequent or any("occasional preemptions are fine" in note for note in d.notes)


@pytest.mark.parametrize("counters,count,severity", [((1, 51, 101), 101, "critical"), ((1, 2, 3), 3, "warning")])
def test_v0_preemption_lines_count_by_their_counter(counters: tuple[int, ...], count: int, severity: str) -> None:
    """V0 warns at its 1st, 51st and 101st preemption: three lines 40 s apart are 101 preemptions in 80 s (a storm,
    not 3)."""
    log = VllmLog()
    for n in counters:
        log.add(PREEMPTED.format(n=n), dt=40, level="WARNING", file="scheduler.py:1484")
    (f,) = [f for f in analyze(lines=log.lines).findings if f.id == "retraction.frequent"]
    assert f.severity == severity and f.message.startswith(f"{count} preemptions on 1 rank")


V0_STATS = ("Avg prompt throughput: 2706.1 tokens/s, Avg generation throughput: 13395.4 tokens/s, Running: 34 reqs, "
            "Swapped: {swapped} reqs, Pending: 9832 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 70.4%.")


@pytest.mark.parametrize("swapped,fires", [((100, 137), True), ((0, 5), True), ((0, 0, 5), False), ((0, 0), False)])
def test_requests_swapped_out_on_half_the_stats_lines_ask_for_more_kv_memory(swapped: tuple[int, ...],
                                                                            fires: bool) -> None:
    """vllm#5578: 100 and 137 requests swapped out to CPU at 99% KV: the KV cache cannot hold the batch."""
    log = VllmLog()
    for n in swapped:
        log.add(V0_STATS.format(swapped=n), dt=5, file="metrics.py:341")
    d = analyze(lines=log.lines)
    findings = [f for f in d.findings if f.id == "retraction.swapped"]
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.flag, f.suggested, f.confidence) == ("--gpu-memory-utilization", "0.95 (or --max-num-seqs lower)", "low")
        assert f.evidence.facts["max_swapped"] == max(swapped)


@pytest.mark.parametrize("lines,count", [
    ((1001, 1, 1051), 52),  # engine A at 1,001 and 1,051, engine B at 1: 51 + 1
    ((1, 1, 51, 51), 102),  # two engines warning at their 1st and 51st
    ((1, None, 51), 52),  # a line cut before its counter counts one of its own
])
def test_v0_counters_of_interleaved_engines_count_each_engines_growth(lines: tuple[int | None, ...],
                                                                      count: int) -> None:
    from toolkit.diagnose.rules.retraction import per_rank_rates

    log = VllmLog()
    for n in lines:
        text = PREEMPTED.format(n=n) if n is not None else PREEMPTED.format(n=0).split(" total_num")[0]
        log.add(text, dt=20, level="WARNING", file="scheduler.py:1484")
    d = analyze(lines=log.lines)
    from toolkit.diagnose.rules.context import Context

    assert sum(n for n, _ in per_rank_rates(Context(d.timeline)).values()) == count


def test_v1_stats_preemptions_are_counted_beside_a_resumed_line() -> None:
    """360 preemptions in V1's stats lines and one `Preempted request ... resumed` line: frequent, not the one line."""
    log = VllmLog().start()
    for _ in range(12):
        log.add(lf.vllm_stats(running=64, waiting=10, usage=0.95, gen=900.0, preemptions=30), dt=10)
    log.add(lf.vllm_resumed("cmpl-1"), dt=1, process="EngineCore_DP0", pid=9, file="scheduler.py:500")
    assert "retraction.frequent" in {f.id for f in analyze(lines=log.lines).findings}


def test_swapped_lines_are_a_share_of_the_busy_ones_and_more_memory_only_below_the_ceiling() -> None:
    """30 idle lines then 20 with requests swapped out: 20 of 20 busy lines. At 0.98 already, fewer sequences."""
    log = VllmLog()
    idle = V0_STATS.replace("Running: 34", "Running: 0")
    for _ in range(30):
        log.add(idle.format(swapped=0), dt=5, file="metrics.py:341")
    for _ in range(20):
        log.add(V0_STATS.format(swapped=100), dt=5, file="metrics.py:341")
    (f,) = [f for f in analyze(lines=log.lines).findings if f.id == "retraction.swapped"]
    assert f.evidence.count == 20 and f.evidence.total == 20 and f.flag == "--gpu-memory-utilization"
    args = "(APIServer pid=1) INFO 06-16 21:24:00 [utils.py:233] non-default args: {'gpu_memory_utilization': 0.98}"
    (f,) = [f for f in analyze(lines=[args, *log.lines]).findings if f.id == "retraction.swapped"]
    assert f.flag == "--max-num-seqs" and f.suggested.startswith("lower")


def test_frequent_preemptions_are_said_once_not_again_as_swapped() -> None:
    log = VllmLog()
    for n in (1, 51):
        log.add(PREEMPTED.format(n=n), dt=10, level="WARNING", file="scheduler.py:1484")
        log.add(V0_STATS.format(swapped=100), dt=1, file="metrics.py:341")
    assert {f.id for f in analyze(lines=log.lines).findings} & {"retraction.frequent", "retraction.swapped"} == {
        "retraction.frequent"}


@pytest.mark.parametrize("events,frequent", [(1, False), (2, True)])
def test_a_tp_group_retracting_is_counted_per_rank_not_summed(events: int, frequent: bool) -> None:
    """Eight TP ranks print each retraction: one event is 8 lines but one retraction a rank (occasional); two 20 s
    apart are two on each rank (sgl-project/sglang#4184's TP16 group: frequent)."""
    log = Log("0.4.9", lf.Rank(tp=0, tp_size=8)).start(Startup(), model_path="m").decode_series(5)
    for _ in range(events):
        log.t += 20
        for tp in range(8):
            log.add(lf.retract("0.4.9", k=1, old=0.5, new=0.9), rank=lf.Rank(tp=tp, tp_size=8))
    d = analyze(lines=log.lines)
    assert any(f.id == "retraction.frequent" for f in d.findings) is frequent


# -- an OOM while the weights load -------------------------------------------------------------------------------

LOAD_OOM = ("(VllmWorkerProcess pid=195295) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] "
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a total capacity of "
            "14.62 GiB of which 3.31 MiB is free.")
TRACEBACK = ["(VllmWorkerProcess pid=195297) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] Exception in worker "
             "VllmWorkerProcess while processing method {method}.",
             "(VllmWorkerProcess pid=195297) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] Traceback (most "
             "recent call last):",
             '(VllmWorkerProcess pid=195297) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242]   File "/vllm/'
             'executor/multiproc_worker_utils.py", line 236, in _run_worker_process']


@pytest.mark.parametrize("method,rule", [("load_model", "oom.weights"), ("execute_model", "oom.other")])
def test_an_oom_while_the_model_loads_asks_for_more_gpus_not_less_memory(method: str, rule: str) -> None:
    """vllm-project/vllm#14095: a worker's CUDA OOM, then another worker's traceback of `load_model`: the weights do
    not fit, so more tensor parallelism (or a quantized model), never a lower memory fraction."""
    d = analyze(lines=[LOAD_OOM] + [line.format(method=method) for line in TRACEBACK])
    (f,) = [f for f in d.findings if f.id.startswith("oom.")]
    assert f.id == rule
    if rule == "oom.weights":
        assert (f.flag, f.suggested, f.current) == ("--tensor-parallel-size", "higher (or --quantization)", None)
    else:
        assert f.flag == "--gpu-memory-utilization"


@pytest.mark.parametrize("quote", ["", "> ", ">> "])
def test_a_traceback_pasted_as_a_quote_reads_as_the_traceback_it_quotes(quote: str) -> None:
    """Every line of a quoted traceback carries the quote (`> `): the record continues through it, so the frames
    still say the model was loading (`oom.weights`, not a crash and a bare OOM)."""
    tb = ["Traceback (most recent call last):",
          '  File "/x/vllm/worker/model_runner.py", line 1, in load_model',
          "    self.model = get_model(...)",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    d = analyze(lines=[quote + line for line in tb])
    assert [f.id for f in d.findings] == ["oom.weights"]


# https://github.com/sgl-project/sglang/issues/4489: a start-up traceback through the overlap worker's constructor
STARTUP_TRACEBACK = "\n".join([
    "Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1748, in run_scheduler_process',
    "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker_overlap_thread.py", line 63, in __init__',
    "    self.worker = TpModelWorker(server_args, gpu_id, tp_rank, dp_rank, nccl_port)",
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 166, in __init__',
    "    self.initialize(min_per_gpu_memory)",
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 207, in initialize',
    "    self.init_cuda_graphs()",
    "Exception: Capture cuda graph failed: backend='inductor' raised: NotImplementedError"])


@pytest.mark.parametrize("compile_on,change", [(True, Change("torch_compile", False)), (False, None)])
def test_a_start_up_crash_with_torch_compile_on_advises_starting_without_it(compile_on: bool, change) -> None:
    """Start-up frames (the model runner built) with `--enable-torch-compile`: start without it; without the flag no
    workaround. The overlap worker's constructor in the frames is no overlap crash."""
    f, d = _crash(_sglang(STARTUP_TRACEBACK.replace("Exception: Capture cuda graph failed: ", "RuntimeError: "),
                          enable_torch_compile=compile_on))
    assert f.change == change and "--disable-overlap-schedule" not in (d.command or "")
    if compile_on:
        assert f.flag == "--enable-torch-compile" and "torch.compile" in f.message


def test_the_real_paste_with_torch_compile_on_advises_starting_without_it() -> None:
    lines = ["#### command", "docker run --gpus '\"device=4,5\"' -d --name q -p 30000:30000 lmsysorg/sglang:latest  "
             "python3 -m sglang.launch_server --model-path /data/q --tp 2 --enable-torch-compile --mem-fraction-static "
             "0.8", *STARTUP_TRACEBACK.splitlines()[:-1]]
    d = analyze(lines=lines)
    assert d.config.arg("enable_torch_compile") is True and d.config.tp_size == 2
    (f,) = [f for f in d.findings if f.id == "crash.exception"]
    assert f.flag == "--enable-torch-compile"


@pytest.mark.parametrize("line,kind", [
    # https://github.com/sgl-project/sglang/issues/19081: 0.5's busy-time check
    ("AssertionError: Mem Leak Detected! total_tokens=1029056 vs self.max_total_num_tokens=1029120", "leak"),
    ("[2026-02-27 23:50:14 TP0] [Mem Check (BUSY)] available_size=13824, evictable_size=942080", None),
])
def test_the_busy_time_leak_check_is_a_leak(line: str, kind: str | None) -> None:
    assert [e.kind for e in parse_lines([line])] == ([kind] if kind else [])


# -- SGLang's mamba state pool ------------------------------------------------------------------------------

MAMBA_ERRORS = [
    "AssertionError: Not enough space for mamba cache, try to increase --mamba-full-memory-ratio or "
    "--max-mamba-cache-size. mid=None, self.mamba_pool.size=28, self.mamba_pool.available_size()=0, len(reqs)=2",
    "AssertionError: Not enough space for mamba ping pong idx, try to increase --mamba-full-memory-ratio.",
    "RuntimeError: Not enough space for decoupled drafter mamba rollback checkpoints. Try to increase "
    "--mamba-full-memory-ratio or --max-mamba-cache-size. request_id=7, window=4",
]


@pytest.mark.parametrize("error", MAMBA_ERRORS, ids=["cache", "ping-pong", "drafter"])
def test_a_mamba_pool_out_of_slots_advises_more_memory_for_mamba_states(error: str) -> None:
    """Raised where a batch is admitted (normal loop: no overlap advice takes its place); the state slots are the
    other way, fewer running requests the trade."""
    f, _ = _crash(_sglang(lf.scheduler_traceback("event_loop_normal", error), mamba_full_memory_ratio=0.9,
                          max_mamba_cache_size=28))
    assert f.change == Change("mamba_memory", direction=1) and f.flag == "--mamba-full-memory-ratio"
    assert f.current == "0.9"
    assert f.alternatives == (Change("mamba_slots", direction=1), Change("running_cap", direction=-1))
    assert "--max-mamba-cache-size" in f.suggested and "--max-running-requests" in f.tradeoff
    assert f.evidence.facts["max_mamba_cache_size"] == 28 and "mamba state pool" in f.message


def test_a_mamba_pool_error_followed_by_another_exception_still_names_its_flags() -> None:
    """`During handling of the above exception, another exception occurred:` prints a second error line last."""
    chained = "\n".join([lf.scheduler_traceback("event_loop_normal", MAMBA_ERRORS[1]), "",
                         "During handling of the above exception, another exception occurred:", "",
                         "Traceback (most recent call last):", '  File "/x/scheduler.py", line 9, in run',
                         "RuntimeError: scheduler stopped"])
    f, _ = _crash(_sglang(chained))
    assert f.change == Change("mamba_memory", direction=1)


def test_the_mamba_pool_error_names_the_cause_before_the_overlap_frames() -> None:
    f, _ = _crash(_sglang(lf.scheduler_traceback("event_loop_overlap", MAMBA_ERRORS[0])))
    assert f.change == Change("mamba_memory", direction=1) and f.current is None


@pytest.mark.parametrize("error", [
    "AssertionError: Not enough space for the KV cache",  # not the mamba pool
    'RuntimeError: CUDA error: an illegal memory access was encountered',
])
def test_other_assertions_get_no_mamba_advice(error: str) -> None:
    f, _ = _crash(_sglang(lf.scheduler_traceback("event_loop_normal", error)))
    assert f.change is None


def test_a_source_line_that_quotes_the_mamba_message_is_not_its_error() -> None:
    """Only the traceback's error line names the cause, never the source it quotes."""
    quoted = lf.scheduler_traceback("event_loop_normal").replace(
        "    self.process_batch_result(batch, result)",
        '    ), "Not enough space for mamba cache, try to increase --mamba-full-memory-ratio"')
    f, _ = _crash(_sglang(quoted))
    assert f.change is None


def test_the_real_mamba_ping_pong_crash_advises_the_mamba_flags() -> None:
    d = analyze([REAL / "downstream" / "glm53-sm120-12-mamba-pingpong-crash.log"])
    f = next(f for f in d.findings if f.id == "crash.exception")
    assert f.flag == "--mamba-full-memory-ratio" and "--max-mamba-cache-size" in f.suggested


# -- vLLM's sampler warm-up, cut before its error line ------------------------------------------------------------

VWORKER = "(VllmWorker rank=1 pid=1739270) ERROR 05-15 17:46:32 [multiproc_executor.py:380] "
SAMPLER_WARMUP = [VWORKER + line for line in [
    "WorkerProc hit an exception: %s", "Traceback (most recent call last):",
    '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1484, in _dummy_sampler_run',
    "    sampler_output = self.model.sample("]]


def _vllm_crash(lines: list[str]):
    d = analyze(lines=["INFO 05-15 17:40:00 [api_server.py:1043] non-default args: {'max_num_seqs': 256}", *lines])
    return next(f for f in d.findings if f.id == "crash.exception")


def test_a_sampler_warm_up_cut_before_its_error_lowers_the_running_cap() -> None:
    """vllm#18136 (held-out batch 18): vLLM warms the sampler up on as many dummy requests as may run at once, and
    asks for a lower max_num_seqs or gpu_memory_utilization where that runs out of memory."""
    f = _vllm_crash(SAMPLER_WARMUP)
    assert f.change == Change("running_cap", direction=-1) and f.flag == "--max-num-seqs" and f.current == "256"
    assert f.alternatives == (Change("kv_memory", direction=-1),) and "--gpu-memory-utilization" in f.suggested
    assert "_dummy_sampler_run" in f.message and f.evidence.facts["frames"] == "_dummy_sampler_run"


def test_a_sampler_warm_up_whose_error_line_names_another_cause_gets_no_running_cap() -> None:
    f = _vllm_crash([*SAMPLER_WARMUP, VWORKER + "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert f.change is None


def test_the_real_sampler_warm_up_crash_names_both_flags() -> None:
    d = analyze([REAL / "vllm" / "vllm-18136-v1-sampler-warmup-crash-tp4.log"])
    f = next(f for f in d.findings if f.id == "crash.exception")
    assert f.flag == "--max-num-seqs" and "--gpu-memory-utilization" in f.suggested
