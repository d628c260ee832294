"""vLLM logs: the configuration is read from the engine config and capacity lines, the same rule ideas judge the
stats lines, and the advice names vLLM's flags (`vllm serve` command included)."""
from __future__ import annotations

import pytest

from toolkit.diagnose import analyze
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import VllmLog

N = 30


def findings(log: VllmLog) -> dict:
    return {f.id: f for f in analyze(lines=log.lines).findings}


def test_the_configuration_comes_from_the_engine_config_and_capacity_lines() -> None:
    d = analyze(lines=VllmLog().start(tp=2, max_num_seqs=64, gpu_memory_utilization=0.85).lines)
    cfg = d.config
    assert (cfg.engine, cfg.engine_version, cfg.tp_size, cfg.parallelism_source) == ("vllm", "0.11.0", 2, "arguments")
    assert (cfg.max_total_num_tokens, cfg.context_len, cfg.max_running_requests) == (447088, 32768, 64)
    assert (cfg.weight_mem_gb, cfg.kv_mem_gb, cfg.graph_mem_gb) == (15.264, 54.62, 0.33)
    assert cfg.max_concurrency == 13.64 and cfg.mem_fraction_static == 0.85 and cfg.device == "gpu"
    assert d.command == "vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2 --gpu-memory-utilization 0.85 " \
                        "--max-num-seqs 64"
    (f,) = [f for f in d.findings if f.id == "capacity.pool_vs_concurrency"]
    assert f.suggested == "if requests run long: --max-num-seqs 13, or --max-model-len 6985"


def test_kv_usage_high_with_waiting_requests_is_memory_bound() -> None:
    log = VllmLog().start(gpu_memory_utilization=0.85).stats_series(N, running=200, waiting=40, usage=0.97, gen=3000.0)
    found = findings(log)
    f = found["capacity.pool_bound"]
    assert (f.flag, f.suggested, f.current) == ("--gpu-memory-utilization", "0.90", "0.85")
    assert "--kv-cache-dtype fp8" in f.message
    assert (found["fp8.kv_cache"].flag, found["fp8.kv_cache"].suggested) == ("--kv-cache-dtype", "fp8")
    d = analyze(lines=log.lines)
    assert "--gpu-memory-utilization 0.90" in d.command and "--kv-cache-dtype fp8" in d.command


def test_preemptions_in_the_stats_lines_are_retractions() -> None:
    log = VllmLog().start().stats_series(N, running=200, waiting=10, usage=0.99, gen=3000.0, preemptions=[0, 5])
    f = findings(log)["retraction.frequent"]
    assert f.title == "Preemption storm" and f.severity == "critical"
    assert (f.flag, f.suggested, f.current) == ("--gpu-memory-utilization", "0.95", "0.9 (default)")
    assert "75 preemptions on 1 rank, up to 15.5 per busy minute on DP0" in f.message
    calm = VllmLog().start().stats_series(N, running=200, waiting=10, usage=0.99, gen=3000.0, preemptions=[0, 3])
    assert findings(calm)["retraction.frequent"].title == "Frequent preemptions"


def test_v0_preemption_warnings_are_retractions() -> None:
    log = VllmLog().start().stats_series(N, running=20, waiting=0, usage=0.5, gen=1000.0)
    for i in range(4):
        log.add("Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
                f"space. total_num_cumulative_preemption={i + 1}", dt=10, level="WARNING", file="scheduler.py:1481")
    f = findings(log)["retraction.frequent"]
    assert f.severity == "warning" and f.evidence.count == 4 and f.flag == "--gpu-memory-utilization"


def test_usage_low_with_waiting_requests_points_at_the_batch_budget() -> None:
    log = VllmLog().start().add(
        "Chunked prefill is enabled with max_num_batched_tokens=2048.", file="scheduler.py:308")
    f = findings(log.stats_series(N, running=40, waiting=25, usage=0.3, gen=2000.0))["usage.low_while_queued"]
    assert (f.flag, f.suggested, f.current) == ("--max-num-batched-tokens", "8192", "2048")


@pytest.mark.parametrize("usage,fires", [(0.79, True), (0.80, False)])
def test_running_pinned_at_max_num_seqs(usage: float, fires: bool) -> None:
    log = VllmLog().start(max_num_seqs=64).stats_series(N, running=64, waiting=30, usage=usage, gen=2000.0)
    f = findings(log).get("running_cap.pinned")
    assert (f is not None) is fires
    if fires:
        assert (f.flag, f.suggested, f.current) == ("--max-num-seqs", str(int(64 * 0.9 / 0.79)), "64")


def test_the_queue_empty_rule_judges_stats_lines() -> None:
    f = findings(VllmLog().start().stats_series(N, running=10, waiting=0, usage=0.1, gen=500.0))
    assert f["queue.empty_under_load"].severity == "info" and "steady stats lines" in f["queue.empty_under_load"].message


@pytest.mark.parametrize("running,fires", [(600, True), (512, False)])
def test_batches_above_the_capture_size_suggest_a_larger_one(running: int, fires: bool) -> None:
    f = findings(VllmLog().start().stats_series(N, running=running, waiting=0, usage=0.5, gen=9000.0))
    assert ("cuda_graph.ceiling" in f) is fires
    if fires:
        c = f["cuda_graph.ceiling"]
        assert (c.flag, c.suggested, c.current) == ("--max-cudagraph-capture-size", "1024", "512")


def test_enforce_eager_suggests_graphs() -> None:
    f = findings(VllmLog().start(enforce_eager=True).stats_series(N, running=8, waiting=0, usage=0.1, gen=500.0))
    assert (f["cuda_graph.disabled"].flag, f["cuda_graph.disabled"].suggested) == ("--enforce-eager", "remove (graphs on)")


def test_a_max_model_len_that_does_not_fit_suggests_the_estimate() -> None:
    log = VllmLog().start(kv_tokens=20000, max_model_len=131072)
    log.add("EngineCore failed to start.", level="ERROR", file="core.py:708", process="EngineCore_DP0")
    log.add("ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (9.45 GiB). Based on the available memory, "
            "the estimated maximum model length is 77392.", level="ERROR", file="core.py:708", process="EngineCore_DP0")
    f = findings(log)
    assert (f["oom.startup"].flag, f["oom.startup"].change.value) == ("--max-model-len", "77392")
    assert f["oom.startup"].suggested == "77392 (or --gpu-memory-utilization higher)"  # more memory keeps the context
    assert f["capacity.context_exceeds_pool"].flag == "--max-model-len"
    assert "crash.exception" not in f


def test_cuda_out_of_memory_lowers_the_memory_utilization() -> None:
    log = VllmLog().start(gpu_memory_utilization=0.95).stats_series(N, running=10, waiting=0, usage=0.2, gen=900.0)
    for text in ("EngineCore encountered a fatal error.", "Traceback (most recent call last):",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."):
        log.add(text, level="ERROR", file="core.py:708", process="EngineCore_DP0")
    f = findings(log)["oom.other"]
    assert (f.flag, f.suggested, f.current) == ("--gpu-memory-utilization", "0.90", "0.95")


def test_sglang_advice_is_unchanged_for_the_same_idea() -> None:
    log = lf.Log("0.4.9").start(lf.Startup(available=12.0), model_path="m", tp_size=1, mem_fraction_static=0.85)
    log.decode_series(N, running=200, queue=8, usage=0.95)
    f = {x.id: x for x in analyze(lines=log.lines).findings}
    assert f["capacity.pool_bound"].flag == "--mem-fraction-static"
    assert (f["fp8.kv_cache"].flag, f["fp8.kv_cache"].suggested) == ("--kv-cache-dtype", "fp8_e5m2")
    assert analyze(lines=log.lines).command.startswith("python -m sglang.launch_server --model-path m")


def test_a_dated_window_selects_the_lines_of_a_year_less_vllm_log(tmp_path) -> None:
    """`toolkit tune` and `report` cut the log to the bench window, given in dated (unix) times; vLLM prints
    `MM-DD HH:MM:SS`, so the window is moved onto that clock (same month, day and time) — by both parser paths."""
    log, printed = lf.VllmLog().start(max_num_seqs=4), []
    for _ in range(40):
        printed.append(log.add(lf.vllm_stats(running=4, waiting=30, usage=0.02, gen=300.0), dt=1).t)
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(log.lines) + "\n")
    window = (printed[5], printed[35])
    other_day = (window[0] + 86400, window[1] + 86400)  # the same times a day later: none of the lines
    for cut, expected in ((window, 31), (other_day, 0)):
        for d in (analyze([path], window=cut), analyze(lines=log.lines, window=cut)):
            assert len(d.timeline.series("stats")) == expected, cut
    inside = analyze([path], window=window)
    assert "running_cap.pinned" in {f.id for f in inside.findings}


def test_a_window_moves_onto_the_logs_clock_only_when_the_log_has_no_date() -> None:
    from toolkit.diagnose.read.prefix import window_on_clock

    window = (lf.T0, lf.T0 + 10)  # 2025-11-11 04:06:27 UTC
    assert window_on_clock(window, lf.T0 + 5) == window  # a dated log
    assert window_on_clock(window, 3600.0) == (4 * 3600 + 387, 4 * 3600 + 397)  # time of day only, day 0
    assert window_on_clock((lf.T0 + 70000, lf.T0 + 73000), 3600.0) == (84787, 86400 + 1387)  # over midnight


@pytest.mark.parametrize("below_cap,fires", [(20, True), (12, False)])
def test_a_queue_held_mostly_at_the_cap_is_the_caps_finding_not_the_budgets(below_cap: int, fires: bool) -> None:
    """With `--max-num-seqs 2` the batch dips to 1 between requests; those few lines must not read as the token
    budget holding the queue (the vLLM-CPU tune run's start: 107 of 128 lines at the cap, 15 below)."""
    log = lf.VllmLog().start(max_num_seqs=2)
    below = set(range(0, 40, 40 // below_cap)[:below_cap])
    for i in range(40):
        log.add(lf.vllm_stats(running=1 if i in below else 2, waiting=20, usage=0.01, gen=30.0), dt=1)
    found = {f.id for f in analyze(lines=log.lines).findings}
    assert ("usage.low_while_queued" in found) is fires
    assert "running_cap.pinned" in found or fires
