"""The rules operators ask about most, each just across its threshold on both sides: throughput collapse, a
capacity-bound pool, a pool too small for the context x the asked concurrency, the CUDA-graph ceiling, graph
capture memory, and TP/DP sizes from rank tags."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.diagnose import analyze
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Rank, Startup

REAL = Path(__file__).parent / "real_logs"
N = 30
ARGS = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, mem_fraction_static=0.85,
            schedule_policy="fcfs", cuda_graph_max_bs=256)


def base(startup: Startup = Startup(), era: str = "0.4.9", rank: Rank = Rank(), **args) -> Log:
    return Log(era, rank).start(startup, **{**ARGS, **args})


def found(log: Log, rule: str):
    return [f for f in analyze(lines=log.lines).findings if f.id == rule]


def _collapse(factor: float, cause: str | None = None, before: int = 30, after: int = 30) -> Log:
    """Gen throughput 3000 tok/s, then 3000 / factor at the same batch, the pool still nearly full."""
    log = base()
    log.decode_series(before, running=120, queue=3, usage=0.93, throughput=3000.0)
    if cause == "retraction":
        log.add(lf.retract("0.4.9", k=1, old=0.5, new=0.9), dt=1)
    graph = cause != "graph"
    log.decode_series(after, running=120, queue=3, usage=0.93, throughput=3000.0 / factor, graph=graph)
    return log


@pytest.mark.parametrize("factor,fires", [(3.05, True), (2.95, False)])
def test_throughput_collapse_is_a_drop_below_a_third(factor: float, fires: bool) -> None:
    assert bool(found(_collapse(factor), "throughput.collapse")) is fires


def test_throughput_collapse_after_a_retraction_names_it_and_the_flag() -> None:
    (f,) = found(_collapse(10.0, "retraction"), "throughput.collapse")
    assert f.severity == "warning" and f.title == "Gen throughput collapsed 10x"
    assert "fell from 3000 to 300 tok/s" in f.message and "with the KV pool 93% used" in f.message
    assert "A retraction at line" in f.message
    assert (f.flag, f.suggested, f.current) == ("--schedule-conservativeness", "1.3", "1")
    assert f.evidence.facts["running_before"] == f.evidence.facts["running_after"] == 120


def test_throughput_collapse_on_a_graph_fallback_without_outgrowing_the_ceiling_names_no_flag() -> None:
    (f,) = found(_collapse(10.0, "graph"), "throughput.collapse")
    assert "stopped using CUDA graphs" in f.message and f.flag is None


def test_throughput_collapse_needs_the_same_batch() -> None:
    log = base().decode_series(30, running=120, queue=3, usage=0.5, throughput=3000.0)
    log.decode_series(30, running=20, queue=0, usage=0.1, throughput=300.0)  # the load fell, not the speed
    assert found(log, "throughput.collapse") == []


@pytest.mark.parametrize("usage,fires", [(0.90, True), (0.89, False)])
def test_capacity_bound_pool_at_ninety_percent_with_a_queue(usage: float, fires: bool) -> None:
    log = base(Startup(available=12.0)).decode_series(N, running=200, queue=8, usage=usage)
    got = found(log, "capacity.pool_bound")
    assert bool(got) is fires
    if fires:
        assert (got[0].flag, got[0].suggested) == ("--mem-fraction-static", f"{0.85 + (12.0 - 6.5) / 78.5:.3f}")


@pytest.mark.parametrize("full,fires", [(15, True), (14, False)])
def test_capacity_bound_pool_in_half_the_lines_with_a_queue(full: int, fires: bool) -> None:
    mask = [((i * full) // N) != (((i + 1) * full) // N) for i in range(N)]
    log = base().decode_series(N, running=200, queue=8, usage=[0.95 if m else 0.5 for m in mask])
    assert bool(found(log, "capacity.pool_bound")) is fires


@pytest.mark.parametrize("queued,fires", [(5, True), (4, False)])
def test_capacity_bound_pool_needs_more_than_a_brief_queue(queued: int, fires: bool) -> None:
    """Full whenever requests wait, judged on the lines with a queue: five such lines at least."""
    mask = [((i * queued) // N) != (((i + 1) * queued) // N) for i in range(N)]
    log = base().decode_series(N, running=200, queue=[8 if m else 0 for m in mask], usage=0.95)
    assert bool(found(log, "capacity.pool_bound")) is fires


def test_capacity_bound_pool_without_spare_memory_suggests_an_fp8_kv_cache() -> None:
    (f,) = found(base(Startup(available=6.5)).decode_series(N, running=200, queue=8, usage=0.95),
                 "capacity.pool_bound")
    assert (f.flag, f.suggested, f.current) == ("--kv-cache-dtype", "fp8_e5m2", "auto")


@pytest.mark.parametrize("pool,fires", [(65535, True), (65536, False)])
def test_a_pool_smaller_than_one_full_context_request(pool: int, fires: bool) -> None:
    got = found(base(Startup(max_total=pool, context_len=65536)).decode_series(5), "capacity.context_exceeds_pool")
    assert bool(got) is fires
    if fires:
        assert (got[0].flag, got[0].suggested, got[0].current) == ("--context-length", "64512", "65536")


@pytest.mark.parametrize("asked,fires", [(11, True), (10, False)])
def test_a_pool_too_small_for_the_context_times_the_asked_concurrency(asked: int, fires: bool) -> None:
    log = base(Startup(max_total=655360, context_len=65536, max_running=asked), max_running_requests=asked)
    got = found(log.decode_series(5), "capacity.pool_vs_concurrency")
    assert bool(got) is fires
    if fires:
        assert got[0].severity == "info" and got[0].flag is None and got[0].current == "11"
        assert got[0].suggested == "if requests run long: --max-running-requests 10, or --context-length 59578"
        assert got[0].evidence.facts["full_context_requests"] == 10.0


@pytest.mark.parametrize("above,fires", [(15, True), (14, False)])
def test_cuda_graph_ceiling_when_the_batch_sits_above_the_captured_maximum(above: int, fires: bool) -> None:
    mask = [((i * above) // N) != (((i + 1) * above) // N) for i in range(N)]
    log = base(era="0.4.3").decode_series(N, running=[300 if m else 200 for m in mask], queue=2)
    got = found(log, "cuda_graph.ceiling")
    assert bool(got) is fires
    if fires:
        assert (got[0].flag, got[0].suggested, got[0].current) == ("--cuda-graph-max-bs", "512", "256")


@pytest.mark.parametrize("graph_gb,fires", [(1.5, True), (1.4, False)])
def test_graph_capture_memory_against_what_is_left(graph_gb: float, fires: bool) -> None:
    log = base(Startup(graph_mem=graph_gb, available=1.45)).decode_series(5)
    got = found(log, "cuda_graph.capture_memory")
    assert bool(got) is fires
    if fires:
        assert (got[0].flag, got[0].suggested, got[0].current) == ("--cuda-graph-max-bs", "128", "256")


def test_tp_and_dp_sizes_from_rank_tags_without_server_args() -> None:
    log = Log("0.4.9")
    for dp in range(2):
        for tp in range(4):
            log.add(lf.decode("0.4.9", running=10, token=100, usage=0.1, throughput=100.0, queue=0), dt=0.1,
                    rank=Rank(tp=tp, dp=dp, tp_size=4))
    d = analyze(lines=log.lines)
    assert (d.config.tp_size, d.config.dp_size, d.config.parallelism_source) == (4, 2, "rank tags")
    d = analyze(lines=base(tp_size=2, dp_size=1).decode_series(3).lines)
    assert (d.config.tp_size, d.config.parallelism_source) == (2, "arguments")


# -- inputs rejected for their length (SGLang), and vLLM's own count of full-context requests -----------------------

def _too_long(input_len: int, allowed: int, ranks: int = 2) -> list[str]:
    return [f"Input length ({input_len} tokens) exceeds the maximum allowed length ({allowed} tokens). Use a "
            "shorter input or enable --allow-auto-truncate."] * ranks


@pytest.mark.parametrize("pool,pool_limits", [(65535, True), (65536, False)])
def test_an_input_longer_than_allowed_is_the_pool_below_the_context_and_the_client_at_it(pool: int,
                                                                                         pool_limits: bool) -> None:
    """Context 65,536, SGLang allowing min(context, pool) - 6 input tokens: a pool one token short of the context
    limits the input (a context length that says so, or more KV memory); a pool as large leaves the context's
    limit (the client sent too much)."""
    allowed = min(65536, pool) - 6
    log = base(Startup(context_len=65536, max_total=pool, max_running=64)).decode_series(5)
    for line in _too_long(70000, allowed, ranks=1):
        log.add(line, dt=1)
    (f,) = found(log, "capacity.input_too_long")
    assert f.severity == "warning" and f.evidence.facts["allowed_input_tokens"] == allowed
    if pool_limits:
        assert (f.flag, f.suggested, f.current, f.confidence) == (
            "--context-length", "65535 (or --mem-fraction-static higher; or --kv-cache-dtype fp8_e5m2)", "65536",
            "high")
    else:
        assert f.change is None and (f.action or "").startswith("client: shorter inputs")


def test_an_input_too_long_without_the_start_up_names_both_limits_at_medium_confidence() -> None:
    """sgl-project/sglang#4048: 160,062 tokens on two TP ranks (one request), 59,862 allowed, no start-up lines."""
    (f,) = [f for f in analyze([REAL / "sglang" / "sglang-4048-input-exceeds-allowed-length.log"]).findings
            if f.id == "capacity.input_too_long"]
    assert (f.flag, f.current, f.confidence, f.evidence.facts["requests"]) == ("--context-length", None, "medium", 1)
    assert f.suggested.startswith("59868 ")  # 59,862 + 6: the pool's size


def test_no_rejected_input_no_finding() -> None:
    assert not found(base().decode_series(5), "capacity.input_too_long")


@pytest.mark.parametrize("kv_tokens,concurrency,fires", [(75840, 0.99, True), (75840, 1.0, False),
                                                         (75840, 2.48, False), (130000, 0.9, True)])
def test_vllm_full_context_fit_is_its_own_maximum_concurrency(kv_tokens: int, concurrency: float, fires: bool) -> None:
    """A hybrid model (vllm#28228: 75,840 KV tokens, 2.48x at 120,000 tokens per request) fits a full-context
    request whatever its KV token count says; vLLM's concurrency below 1x does not, even over more KV tokens
    than the context (then the context suggested is what 0.9x holds)."""
    log = lf.VllmLog().start(kv_tokens=kv_tokens, max_model_len=120000)
    log.lines = [line.replace(f"{kv_tokens / 120000:.2f}x", f"{concurrency:.2f}x") for line in log.lines]
    log.stats_series(3, running=4, waiting=0, usage=0.1, gen=300.0)
    got = [f for f in analyze(lines=log.lines).findings if f.id == "capacity.context_exceeds_pool"]
    assert bool(got) is fires
    if fires:
        assert got[0].suggested == str(int(120000 * concurrency) // 1024 * 1024)


# -- a short excerpt's CUDA-graph ceiling, from the `cuda graph:` field ------------------------------------------

def _graph_lines(pairs: list[tuple[int, bool]]) -> list[str]:
    return [f"[2025-11-11 04:06:{i:02d}] Decode batch, #running-req: {running}, #token: 34901, token usage: 0.19, "
            f"cuda graph: {graph}, gen throughput (token/s): 1447.08, #queue-req: 0, " for i, (running, graph)
            in enumerate(pairs)]


@pytest.mark.parametrize("pairs,fires", [
    ([(46, False), (36, False), (28, True), (22, True), (12, True)], True),
    ([(46, False), (28, False), (28, True), (22, True)], False),  # 28 with and without: no ceiling between them
    ([(46, True), (36, True), (28, True)], False)])
def test_a_short_excerpt_whose_graph_lines_split_by_batch_shows_the_capture_ceiling(pairs, fires: bool) -> None:
    """sgl-project/sglang#13023: `cuda graph: False` at 46 and 36 running, True from 28 down (8 lines)."""
    got = [f for f in analyze(lines=_graph_lines(pairs)).findings if f.id == "cuda_graph.not_used"]
    assert bool(got) is fires
    if fires:
        (f,) = got
        assert (f.flag, f.suggested, f.confidence, f.severity) == ("--cuda-graph-max-bs", "64", "medium", "warning")
        assert f.evidence.facts == {"largest_with_graph": 28, "smallest_without": 36}


def test_an_oom_with_only_vllm_prefixes_is_advised_in_vllm_flags() -> None:
    """vllm-project/vllm#15105: two workers' CUDA OOM lines, nothing else: vLLM's logger prefix names the engine."""
    d = analyze([REAL / "vllm" / "vllm-15105-v1-oom-two-ranks.log"])
    (f,) = d.findings
    assert d.config.vllm and f.flag == "--gpu-memory-utilization"
    line = "ERROR 03-19 07:27:53 [multiproc_executor.py:375] "
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB."
    assert not analyze(lines=[text]).config.vllm and analyze(lines=[line + text]).config.vllm


# -- a running batch flat with a queue, the cap not in the log (SGLang) ------------------------------------------

def _prefill_lines(running: list[int], queue: list[int], usage: float = 0.01) -> list[str]:
    return [f"[2025-03-24 02:56:{i:02d} TP0] Prefill batch. #new-seq: 2, #new-token: 254, #cached-token: 4, token "
            f"usage: {usage:.2f}, #running-req: {r}, #queue-req: {q}, " for i, (r, q) in enumerate(zip(running, queue))]


@pytest.mark.parametrize("running,queue,usage,fires", [
    ([0, 2, 32, 30, 29, 30, 27, 30], [0, 68, 68, 66, 63, 61, 56, 54], 0.01, True),   # sglang#4759's shape
    ([69, 70, 71, 72, 73, 74, 75], [130, 129, 128, 127, 126, 125, 124], 0.11, False),  # still growing (#2255)
    ([32, 30, 29, 30, 27, 30], [68, 66, 0, 61, 56, 54], 0.01, False),                  # a line without a queue
    ([32, 30, 29, 30, 27, 30], [68, 66, 63, 61, 56, 54], 0.85, False),                 # the pool is full
    ([6, 6, 5, 6, 6, 6], [68, 66, 63, 61, 56, 54], 0.01, False),                       # a few requests: the load
    ([32, 30, 29, 30, 20, 30], [68, 66, 63, 61, 56, 54], 0.01, False)])                # not flat (20 < 24)
def test_a_flat_batch_with_a_queue_and_free_memory_is_a_cap(running, queue, usage: float, fires: bool) -> None:
    got = [f for f in analyze(lines=_prefill_lines(running, queue, usage)).findings if f.id == "running_cap.plateau"]
    assert bool(got) is fires
    if fires:
        (f,) = got
        assert (f.flag, f.suggested, f.current, f.confidence) == ("--max-running-requests", "higher", None, "medium")
        assert f.evidence.count == 6 and f.evidence.facts["largest_running"] == 32
