"""Every rule: a log that triggers it, and one just on the other side of its threshold that does not."""
from __future__ import annotations

import json

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.findings import MAX_LINES
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Rank, Startup

N = 30
ARGS = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, mem_fraction_static=0.85,
            schedule_policy="fcfs", cuda_graph_max_bs=256)


def ids(log: Log, **kw) -> set[str]:
    return {f.id for f in analyze(lines=log.lines, **kw).findings}


def base(startup: Startup = Startup(), era: str = "0.4.9", rank: Rank = Rank(), **args) -> Log:
    return Log(era, rank).start(startup, **{**ARGS, **args})


def mask(k: int, n: int = N) -> list[bool]:
    """True for the first k of n lines, spread evenly."""
    return [((i * k) // n) != (((i + 1) * k) // n) for i in range(n)]


@pytest.mark.parametrize("zeros,fires", [(27, True), (26, False)])
def test_queue_empty_under_load(zeros: int, fires: bool) -> None:
    log = base().decode_series(N, queue=[0 if m else 5 for m in mask(zeros)], usage=0.5)
    assert ("queue.empty_under_load" in ids(log)) is fires


@pytest.mark.parametrize("long_queue,fires", [(2001, True), (2000, False)])
def test_queue_too_long(long_queue: int, fires: bool) -> None:
    log = base().decode_series(N, queue=[long_queue if m else 50 for m in mask(8)], usage=0.95)
    assert ("queue.too_long" in ids(log)) is fires


def test_queue_too_long_with_lpm_suggests_fcfs() -> None:
    log = base(schedule_policy="lpm").decode_series(N, queue=3000, usage=0.95)
    f = next(f for f in analyze(lines=log.lines).findings if f.id == "queue.too_long")
    assert (f.flag, f.suggested, f.current) == ("--schedule-policy", "fcfs", "lpm")


@pytest.mark.parametrize("low,fires", [(21, True), (20, False)])
def test_usage_low_while_queued(low: int, fires: bool) -> None:
    """Room on half the queued lines or more, and the pool full on fewer than a third (where it fills that often,
    it binds the batch: the room is the trough between its waves): 21 of 30 with room fire, 20 do not."""
    log = base().decode_series(N, queue=20, usage=[0.89 if m else 0.95 for m in mask(low)])
    d = analyze(lines=log.lines)
    assert ("usage.low_while_queued" in {f.id for f in d.findings}) is fires
    if fires:
        f = next(f for f in d.findings if f.id == "usage.low_while_queued")
        assert (f.flag, f.suggested) == ("--schedule-conservativeness", "0.3")
        assert f.evidence.count == 21 and f.evidence.total == N and len(f.evidence.lines) == MAX_LINES  # quoted: 20


@pytest.mark.parametrize("current,suggested", [(0.4, "0.2"), (0.11, "0.1"), (0.1, None), (0.05, None)])
def test_usage_rule_never_suggests_raising_conservativeness(current: float, suggested: str | None) -> None:
    log = base(schedule_conservativeness=current).decode_series(N, queue=20, usage=0.5)
    found = [f for f in analyze(lines=log.lines).findings if f.id == "usage.low_while_queued"]
    assert [f.suggested for f in found] == ([suggested] if suggested else [])


def test_usage_rule_reads_token_count_not_rounded_usage() -> None:
    log = base()
    for _ in range(N):  # usage prints 0.90 but #token says 0.895 of the pool
        log.add(lf.decode("0.4.9", running=100, token=int(0.895 * 665690), usage=0.90, throughput=3000,
                          queue=20), dt=2)
    assert "usage.low_while_queued" in ids(log)


def _retractions(n: int) -> Log:
    log = base()
    lines_between = 300 // n
    for i in range(301):  # decode lines every 2 s: a 600 s busy span
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=3000, queue=0), dt=2)
        if i % lines_between == 1 and n > 0:
            n -= 1
            log.add(lf.retract("0.4.9", k=2, old=0.5, new=0.9))
    return log


@pytest.mark.parametrize("count,fires", [(11, True), (10, False)])
def test_retractions_more_than_once_a_minute(count: int, fires: bool) -> None:
    d = analyze(lines=_retractions(count).lines)
    assert ("retraction.frequent" in {f.id for f in d.findings}) is fires
    if fires:
        f = next(f for f in d.findings if f.id == "retraction.frequent")
        assert (f.flag, f.suggested, f.evidence.count) == ("--schedule-conservativeness", "1.3", 11)
        assert f.evidence.facts["retracted_requests"] == 22
    else:
        assert any("occasional retractions are fine" in n for n in d.notes)


@pytest.mark.parametrize("avail,expected", [
    (4.99, "gpu_memory.too_little"), (5.0, None), (8.0, None), (8.01, "gpu_memory.too_much"),
    (10.0, "gpu_memory.too_much"),
])
def test_available_gpu_memory_band(avail: float, expected: str | None) -> None:
    d = analyze(lines=base(Startup(available=avail)).decode_series(5).lines)
    found = {f.id: f for f in d.findings if f.id.startswith("gpu_memory")}
    assert set(found) == ({expected} if expected else set())
    if expected == "gpu_memory.too_much":
        f = found[expected]
        assert f.severity == ("warning" if avail >= 10 else "info")
        assert float(f.suggested) == pytest.approx(0.85 + (avail - 6.5) / 78.5, abs=1e-3)


@pytest.mark.parametrize("before,expected,shown", [
    (4.99, "gpu_memory.too_little", 4.99), (5.0, None, None), (12.0, None, None), (12.01, "gpu_memory.too_much", 8.01),
    (40.0, "gpu_memory.too_much", 36.0),
])
def test_memory_left_when_capture_began_but_its_end_is_not_in_the_log(before: float, expected: str | None,
                                                                     shown: float | None) -> None:
    """An excerpt cut after `Capture cuda graph begin` (or a capture that failed): at most what capture began with is
    left (too little below 5 GB), at least that less 4 GB of graphs (spare above 8 GB); in between, nothing to say
    and nothing left unjudged (sglang#11716: 11.87 GB before capturing up to bs 512 is SGLang's own margin)."""
    s = Startup(available=before - 0.81)  # the factory's pool line leaves `available` + graph memory
    lines = [line for line in base(s).lines if "Capture cuda graph end" not in line and "max_total_num" not in line]
    d = analyze(lines=lines)
    found = {f.id: f for f in d.findings if f.id.startswith("gpu_memory")}
    assert set(found) == ({expected} if expected else set())
    assert not [why for rule, why in d.unjudged if rule == "gpu_memory"]
    if expected:
        f = found[expected]
        assert f.evidence.facts["available_gb"] == pytest.approx(shown)
        assert f.evidence.facts["before_graphs_gb"] == pytest.approx(before)
        assert ("at most" if before < 5 else "at least") in f.message
    if expected == "gpu_memory.too_much":
        assert found[expected].title.startswith("At least")


@pytest.mark.parametrize("failure,found", [(None, "gpu_memory.too_much"), ("Exception: Capture cuda graph failed: x",
                                                                         None)])
def test_a_capture_that_failed_leaves_nothing_to_call_unused(failure: str | None, found: str | None) -> None:
    """30 GB when capture began: unused, at least 26 GB, where the excerpt is cut there; where the capture then
    failed, the crash says why and no memory is called spare."""
    lines = [line for line in base(Startup(available=29.19)).lines
             if "Capture cuda graph end" not in line and "max_total_num" not in line]
    d = analyze(lines=lines + ([failure] if failure else []))
    assert [f.id for f in d.findings if f.id.startswith("gpu_memory")] == ([found] if found else [])


@pytest.mark.parametrize("after,found", [
    ("", None),                                             # sglang#3434: the excerpt ends at the pool's end
    ("max_total_num", "gpu_memory.too_much"),               # the pool's summary: start-up went on without a capture
    ("decode", "gpu_memory.too_much"),                      # the server ran
    ("graphs off", "gpu_memory.too_much"),                  # nothing is captured after the pool
])
def test_an_excerpt_that_ends_at_the_memory_pools_end(after: str, found: str | None) -> None:
    """With no capture line, the pool's end is what start-up leaves only where graphs are off or the log goes on
    past where a capture would be; an excerpt that ends there stops before the capture: not judged."""
    log = base(Startup(available=15.85), disable_cuda_graph=after == "graphs off")
    if after == "decode":
        log = log.decode_series(5)
    keep = ("Capture cuda graph",) + (() if after == "max_total_num" else ("max_total_num",))
    lines = [line for line in log.lines if not any(k in line for k in keep)]
    d = analyze(lines=lines)
    assert [f.id for f in d.findings if f.id.startswith("gpu_memory")] == ([found] if found else [])
    if found is None:
        assert ("gpu_memory", "the memory left after start-up is not in the log") in d.unjudged


def test_an_error_after_the_server_ran_is_no_failed_capture() -> None:
    """Capture began (its end cut from the log), the server decoded, then an unrelated traceback: the capture did
    not fail, so 30 GB at its start still leaves at least 26 GB unused."""
    lines = [line for line in base(Startup(available=29.19)).decode_series(20).lines
             if "Capture cuda graph end" not in line and "max_total_num" not in line]
    crash = ["Scheduler hit an exception: Traceback (most recent call last):", "ValueError: bad request"]
    d = analyze(lines=lines + crash)
    assert "gpu_memory.too_much" in {f.id for f in d.findings}


def test_available_cpu_memory_is_not_judged() -> None:
    d = analyze(lines=base(Startup(available=40.0, device="cpu")).decode_series(5).lines)
    assert not [f for f in d.findings if f.id.startswith("gpu_memory")]


@pytest.mark.parametrize("phase,flag", [("prefill", "--chunked-prefill-size"), ("decode", "--max-running-requests")])
def test_oom_in_prefill_and_decode(phase: str, flag: str) -> None:
    log = base().decode_series(10, running=200)
    log.add("\n".join(lf.oom_block(phase, 8192, 100, 20)), dt=1)
    d = analyze(lines=log.lines)
    f = next(f for f in d.findings if f.id == f"oom.{phase}")
    assert f.severity == "critical" and f.flag == flag
    assert f.suggested == ("4096" if phase == "prefill" else "150")
    assert "crash.exception" not in {x.id for x in d.findings}  # the OOM explains the crash


def test_retraction_wording_is_not_a_hard_oom() -> None:
    log = base(era="0.4.3").decode_series(10)
    log.add(lf.retract("0.4.3", k=1, old=0.3, new=0.6))
    assert not {i for i in ids(log) if i.startswith("oom")}


def test_not_enough_memory_at_startup() -> None:
    log = base()
    log.add("Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.85")
    f = next(f for f in analyze(lines=log.lines).findings if f.id == "oom.startup")
    assert (f.flag, f.suggested) == ("--mem-fraction-static", "0.90")


@pytest.mark.parametrize("off,fires", [(6, True), (5, False)])
def test_cuda_graph_off_for_batches_it_should_cover(off: int, fires: bool) -> None:
    m = mask(off)
    log = base().decode_series(N, running=[300 if x else 200 for x in m], graph=[not x for x in m], queue=5)
    d = analyze(lines=log.lines)
    assert ("cuda_graph.not_used" in {f.id for f in d.findings}) is fires
    if fires:
        f = next(f for f in d.findings if f.id == "cuda_graph.not_used")
        assert f.flag == "--cuda-graph-max-bs" and f.suggested.startswith("512")
        assert "--cuda-graph-max-bs 512" in d.command and "--mem-fraction-static 0.83" in d.command


@pytest.mark.parametrize("running,fires", [(256, True), (257, False)])
def test_cuda_graph_disabled(running: int, fires: bool) -> None:
    log = base(disable_cuda_graph=True).decode_series(N, running=running, queue=5)
    d = analyze(lines=log.lines)
    assert ("cuda_graph.disabled" in {f.id for f in d.findings}) is fires
    if fires:
        assert "--disable-cuda-graph" not in d.command


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_cuda_graph_advice_is_for_gpus_only(device: str) -> None:
    log = base(Startup(device=device), disable_cuda_graph=True).decode_series(N, running=8, queue=5, graph=False)
    found = {f.id for f in analyze(lines=log.lines).findings if f.id.startswith("cuda_graph")}
    assert found == (set() if device == "cpu" else {"cuda_graph.disabled"})


@pytest.mark.parametrize("usage,fires", [(0.79, True), (0.8, False)])
def test_running_pinned_at_cap_with_free_kv(usage: float, fires: bool) -> None:
    log = base(Startup(max_running=128)).decode_series(N, running=128, queue=40, usage=usage)
    d = analyze(lines=log.lines)
    assert ("running_cap.pinned" in {f.id for f in d.findings}) is fires
    if fires:
        f = next(f for f in d.findings if f.id == "running_cap.pinned")
        assert f.flag == "--max-running-requests" and int(f.suggested) == int(128 * 0.9 / 0.79)


@pytest.mark.parametrize("cap,queue,usage,suggested", [
    (3, 29, 0.04, 32),  # the pool holds ~20x the batch: the demand (3 running + 29 queued) bounds the step
    (8, 500, 0.02, 128),  # pool and demand both far above: at most MAX_STEP (16) x the cap in one step
    (64, 500, 0.6, 96),  # the pool bounds it: 64 x 0.9 / 0.6
])
def test_the_suggested_cap_is_sized_by_the_pool_and_the_demand(cap: int, queue: int, usage: float,
                                                               suggested: int) -> None:
    log = base(Startup(max_running=cap)).decode_series(N, running=cap, queue=queue, usage=usage)
    (f,) = [f for f in analyze(lines=log.lines).findings if f.id == "running_cap.pinned"]
    assert int(f.suggested) == suggested and f.evidence.facts["peak_demand"] == cap + queue


def _prefills(log: Log, cached: int, new: int, queue: int = 30) -> Log:
    for _ in range(N):
        log.add(lf.prefill("0.4.9", new_seq=2, new_token=new, cached=cached, running=100, queue=queue,
                           usage=0.5, token=300000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=3000, queue=queue), dt=1)
    return log


@pytest.mark.parametrize("cached,fires", [(300, True), (290, False)])
def test_high_prefix_reuse_with_fcfs_suggests_lpm(cached: int, fires: bool) -> None:
    log = _prefills(base(), cached=cached, new=1000 - cached)
    assert ("schedule_policy.try_lpm" in ids(log)) is fires


@pytest.mark.parametrize("cached,fires", [(49, True), (50, False)])
def test_no_reuse_with_lpm_and_long_queue_suggests_fcfs(cached: int, fires: bool) -> None:
    log = _prefills(base(schedule_policy="lpm"), cached=cached, new=1000 - cached, queue=150)
    assert ("schedule_policy.try_fcfs" in ids(log)) is fires


@pytest.mark.parametrize("weights,fires", [(15.1, True), (19.7, False)])
def test_dp_over_tp_when_the_model_fits(weights: float, fires: bool) -> None:
    log = base(Startup(weights=weights), rank=Rank(tp=0, tp_size=2), tp_size=2).decode_series(5)
    d = analyze(lines=log.lines)
    assert ("parallelism.dp_over_tp" in {f.id for f in d.findings}) is fires
    if fires:
        assert "--dp-size 2" in d.command and "--tp-size" not in d.command.replace("--tp-size 1", "")


@pytest.mark.parametrize("running,fires", [(16, True), (17, False)])
def test_torch_compile_for_small_models_at_small_batch(running: int, fires: bool) -> None:
    log = base(Startup(weights=2.5)).decode_series(N, running=running, usage=0.05)
    d = analyze(lines=log.lines)
    assert ("torch_compile.small_model" in {f.id for f in d.findings}) is fires
    if fires:
        assert "--enable-torch-compile --torch-compile-max-bs 16" in d.command


@pytest.mark.parametrize("full,fires", [(15, True), (14, False)])
def test_fp8_when_memory_bound(full: int, fires: bool) -> None:
    log = base(Startup(weights=40.0)).decode_series(
        N, queue=[10 if m else 0 for m in mask(full)], usage=0.95)
    found = ids(log)
    assert ("fp8.kv_cache" in found) is fires
    assert ("fp8.weights" in found) is fires


def _stalls(dips: int, prompt: int = 8192) -> Log:
    log = base(chunked_prefill_size=8192)
    for m in mask(dips, 40):
        if m:
            log.add(lf.prefill("0.4.9", new_seq=1, new_token=prompt, cached=0, running=100, queue=3, usage=0.5,
                               token=300000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=500 if m else 3000,
                          queue=3), dt=2)
    return log


@pytest.mark.parametrize("dips,fires", [(6, True), (5, False)])
def test_prefill_stalls_decode(dips: int, fires: bool) -> None:
    d = analyze(lines=_stalls(dips).lines)
    assert ("prefill_stall.throughput_dips" in {f.id for f in d.findings}) is fires
    if fires:
        f = next(f for f in d.findings if f.id == "prefill_stall.throughput_dips")
        assert f.flag == "--chunked-prefill-size" and f.suggested.startswith("4096")


def test_prefill_batches_that_fit_the_suggested_chunk_are_no_stall_a_chunk_fixes() -> None:
    """Short prompts (256 tokens a batch): a chunk of 4096 would cut nothing, so no chunk is advised."""
    assert "prefill_stall.throughput_dips" not in {f.id for f in analyze(lines=_stalls(6, prompt=256).lines).findings}


def test_low_throughput_right_after_idle_is_not_a_finding() -> None:
    log = base()
    for _ in range(3):  # three busy periods separated by 2 minutes of idle
        log.add(lf.decode("0.4.9", running=100, token=300000, usage=0.45, throughput=12.0, queue=0), dt=120)
        log.decode_series(N, running=100, usage=0.45, throughput=3000)
    d = analyze(lines=log.lines)
    assert [f.id for f in d.findings if f.severity != "info"] == []
    frame = d.timeline.frames[""]
    first_after_idle = frame[frame["gen_throughput"] == 12.0]
    assert first_after_idle["after_idle"].all() and len(first_after_idle) == 3
    assert {p.phase for p in d.timeline.phases} >= {"idle", "steady"}


@pytest.mark.parametrize("kind", ["exception", "watchdog", "leak", "graph_capture", "sigquit"])
def test_crashes_watchdog_and_leaks(kind: str) -> None:
    log = base().decode_series(5)
    message = {
        "exception": "Scheduler hit an exception: Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                     "AssertionError: bad batch",
        "watchdog": lf.watchdog("0.4.9", 300),
        "leak": "token_to_kv_pool_allocator memory leak detected! available_size=10, protected_size=0, "
                "self.max_total_num_tokens=665690",
        "graph_capture": "Capture cuda graph failed: CUDA out of memory\nPossible solutions: lower --mem-fraction-static",
        "sigquit": "Received sigquit from a child proces. It usually means the child failed.",
    }[kind]
    log.add(message, dt=1)
    expected = {"sigquit": "crash.exception"}.get(kind, f"crash.{kind}")
    d = analyze(lines=log.lines)
    f = next(f for f in d.findings if f.id == expected)
    assert f.severity == "critical" and f.evidence.lines
    if kind == "exception":
        assert f.message == "Last error: AssertionError: bad batch"
    clean = analyze(lines=base().decode_series(5).lines)
    assert not [x for x in clean.findings if x.id.startswith("crash")]


@pytest.mark.parametrize("achieved,fires", [(8.9, True), (9.0, False)])
def test_client_bottleneck_from_bench(tmp_path, achieved: float, fires: bool) -> None:
    bench = tmp_path / "run.jsonl"
    bench.write_text(json.dumps({"request_rate": 10.0, "achieved_rate": achieved, "send_lag_p99_ms": 3.0}) + "\n")
    d = analyze(lines=base().decode_series(5).lines, bench=str(bench))
    assert ("client.bottleneck" in {f.id for f in d.findings}) is fires


def test_rules_judge_steady_state_not_warm_up() -> None:
    log = base()
    log.decode_series(10, running=[5, 10, 20, 30, 40, 50, 60, 70, 80, 90], queue=0, usage=0.2)  # ramp
    log.decode_series(N, running=100, queue=20, usage=0.95)
    d = analyze(lines=log.lines)
    frame = d.timeline.frames[""]
    assert (frame["phase"].head(8) == "ramp").all()
    assert "queue.empty_under_load" not in {f.id for f in d.findings}


def test_idle_memory_under_a_load_that_never_waited_for_the_pool_names_no_flag() -> None:
    """Held-out batch 23 (an 80-client run on Ascend: no queue, usage 0.68-0.89): 20 GB left is idle, but nothing
    waited for a larger pool; with requests waiting at a full pool the same leftover is the warning it was."""
    quiet = analyze(lines=base(Startup(available=20.0)).decode_series(12, queue=0, usage=0.8).lines)
    (idle,) = [f for f in quiet.findings if f.id == "gpu_memory.too_much"]
    assert (idle.severity, idle.change, idle.flag) == ("info", None, None)
    pressed = analyze(lines=base(Startup(available=20.0)).decode_series(12, queue=20, usage=0.97).lines)
    (needed,) = [f for f in pressed.findings if f.id == "gpu_memory.too_much"]
    assert needed.severity == "warning" and needed.flag == "--mem-fraction-static"
