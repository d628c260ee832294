"""Advice that holds on real logs (docs/log-formats.md §6.2, §9.5): vLLM's start-up KV cache errors in every
prefix they are pasted with, the context that fits, no room for any KV cache, OOM while capturing CUDA graphs and
in the sampler, and short excerpts that already show a problem (a full pool with a queue, hundreds queued at an
empty pool) at low / medium confidence; each across its threshold on synthetic lines and on the corpus excerpts it
was written for."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, VllmLog
from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.report_json import to_dict
from toolkit.diagnose.report_terminal import render
from toolkit.diagnose.read.errors import read_error
from toolkit.diagnose.rules.kv_fit import kv_fit

CORPUS = Path(__file__).parent / "real_logs"
ARGS = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, mem_fraction_static=0.85,
            schedule_policy="fcfs", cuda_graph_max_bs=256)
TRY = " Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
MAX_SEQ_V0 = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
              "stored in KV cache (16816)." + TRY)
MAX_SEQ_V1 = ("ValueError: To serve at least one request with the models's max seq len (1048576), (24.00 GiB KV "
              "cache is needed, which is larger than the available KV cache memory (9.97 GiB)." + TRY)
NO_BLOCKS = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
PREFIXES = ["", "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ", "> ERROR 04-05 01:12:55 [core.py:390] ",
            "[2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302] ", "[rank0]: ",
            "2024-04-27 10:13:05 | ERROR | stderr | ", "(EngineCore_DP0 pid=7) ERROR 11-21 23:10:29 [core.py:700] ",
            # a paste indented by a space (vllm#5079), or begun after a process prefix's `(` (haydeniw/dynamo#165)
            " ", "EngineCore_0 pid=1597554) "]
VLLM_FILE = '  File "/usr/lib/python3/dist-packages/vllm/v1/{}", line 30, in {}'
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def found(lines: list[str], rule: str) -> list[Finding]:
    return [f for f in analyze(lines=lines).findings if f.id == rule]


# -- reading the lines -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("body", [MAX_SEQ_V0, MAX_SEQ_V1, NO_BLOCKS, MAX_SEQ_V0.removeprefix("ValueError: ")[:-1],
                                  f"`{NO_BLOCKS}`"])
def test_vllm_kv_cache_errors_are_read_in_every_pasted_prefix(prefix: str, body: str) -> None:
    d = analyze(lines=[prefix + body])
    assert d.stats.kinds["not_enough_memory"] == 1 and d.config.engine == "vllm"


def test_a_rank_prefixed_traceback_without_times_is_one_record_with_its_error() -> None:
    lines = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/opt/vllm/vllm/worker/worker.py", line 493, in raise_if_cache_size_invalid',
             '[rank0]:     raise ValueError("No available memory for the cache blocks. "',
             "[rank0]: " + NO_BLOCKS]
    d = analyze(lines=lines)
    assert (d.stats.kinds["exception"], d.stats.kinds["not_enough_memory"], d.stats.other) == (1, 1, 0)
    (f,) = [f for f in d.findings if f.id == "oom.startup"]
    assert (f.flag, f.ranks) == ("--gpu-memory-utilization", ())


@pytest.mark.parametrize("line", [
    '    raise ValueError("No available memory for the cache blocks. "',  # a traceback's source line
    "the issue: ValueError: No available memory for the cache blocks.",  # quoted mid-line
    "ValueError: bad block size",  # an error that is no memory error
])
def test_lines_that_only_quote_a_memory_error_are_not_one(line: str) -> None:
    assert analyze(lines=[line]).stats.kinds["not_enough_memory"] == 0


@pytest.mark.parametrize("line,kind", [
    ("OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB.')", "oom"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom"),
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom"),
    ("`RuntimeError: Decode out of memory. Try to lower your batch size.", "oom"),
    ("ValueError: token_to_kv_pool_allocator memory leak detected! available_size=10, protected_size=0", "leak"),
    ("Preempted request cmpl-1-0 has been resumed!", "preempt"),
    ("**Sequence group cmpl-7 is preempted in PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
     "space.", "preempt"),
])
def test_error_lines_outside_a_traceback_are_read_by_the_kind_they_name(line: str, kind: str) -> None:
    assert analyze(lines=[line]).stats.kinds[kind] == 1


PD_PREFILL = ("[2025-06-24 10:00:00 DP0 TP0 EP0] Prefill batch. #new-seq: 1, #new-token: 1024, #cached-token: 0, "
              "token usage: 0.00, #unbootstrapped-req: 0, #queue-req: 3, #transferring-req: 2, "
              "input throughput (token/s): 1234.50, ")


CLIPPED_PREFILL = ("[2026-05-28 02:59:59 TP0] Prefill batch, #new-seq: 1, #new-token: 896, #cached-tounning-req: 45, "
                   "#queue-req: 3, #pending-token: 70187, npu graph: False, input th")  # sglang#25960, as posted


@pytest.mark.parametrize("line,read", [(PD_PREFILL, True), (PD_PREFILL.replace("#unbootstrapped-req: 0, ", ""), True),
                                       (CLIPPED_PREFILL, True),
                                       (PD_PREFILL.replace("#unbootstrapped-req: 0, #queue-req: 3, ", ""), False)])
def test_a_prefill_line_without_running_req_is_read_by_its_own_counts_and_queue(line: str, read: bool) -> None:
    """A PD prefill server prints no `#running-req`, and a line clipped at a fixed width may lose it: the line's
    own counts (`#new-token`, or the bootstrap counts) and `#queue-req` are enough; without the queue it is
    unread."""
    d = analyze(lines=[line])
    assert (d.stats.kinds["prefill"], d.stats.unread) == ((1, 0) if read else (0, 1))
    if read:
        rows = d.timeline.series("prefill")
        assert rows["queue_req"].tolist() == [3.0] and rows["new_token"].tolist()[0] in (896.0, 1024.0)


# -- the context that fits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,asked,fits", [
    (MAX_SEQ_V0, 32768, 16640),  # 16816 rounded down to 256 tokens
    (MAX_SEQ_V0.replace("16816", "256"), 32768, 256),
    (MAX_SEQ_V0.replace("16816", "255"), 32768, 255),  # below one step: as printed
    (MAX_SEQ_V1, 1048576, 435456),  # 1048576 x 9.97 / 24, rounded down
    (MAX_SEQ_V1.replace("9.97 GiB).", "9.45 GiB). Based on the available memory, the estimated maximum model "
                        "length is 5632."), 1048576, 5632),  # vLLM's own estimate
])
def test_the_context_that_fits_is_read_from_the_error(text: str, asked: int, fits: int) -> None:
    fit = kv_fit(read_error(text).refusal)
    assert fit is not None and (fit.asked, fit.fits) == (asked, fits)


def test_max_seq_len_error_advises_the_context_that_fits_or_more_memory() -> None:
    (f,) = found([MAX_SEQ_V0], "oom.startup")
    assert (f.engine, f.flag, f.current) == ("vllm", "--max-model-len", "32768")
    assert f.suggested == "16640 (or --gpu-memory-utilization higher)"
    assert "16640 tokens fit" in f.message and f.tradeoff and f.confidence == "high"
    assert f.evidence.facts["fits"] == 16640


def test_no_cache_blocks_advises_more_gpu_memory() -> None:
    (f,) = found(["vllm-1  | ERROR 11-18 18:07:28 engine.py:366] " + NO_BLOCKS], "oom.startup")
    assert (f.flag, f.suggested, f.current) == ("--gpu-memory-utilization", "0.95", "0.9 (default)")


V0_CONFIG = ("INFO 04-27 10:11:03 llm_engine.py:70] Initializing an LLM engine with config: model='m', "
             "max_seq_len=4096, tensor_parallel_size=1{block}")


@pytest.mark.parametrize("blocks,flag", [(0, "--gpu-memory-utilization"), (1, "--max-model-len"),
                                         (255, "--max-model-len"), (256, None)])
def test_gpu_blocks_at_start_up_are_no_room_or_too_little_for_the_max_seq_len(blocks: int, flag: str | None) -> None:
    """0 blocks: no room for a KV cache at all. 255 x 16 = 4,080 tokens < max_seq_len 4096: V0 refuses to start
    (the check's error line need not be in the log); 256 x 16 = 4,096 holds it."""
    lines = [V0_CONFIG.format(block=""), f"INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: {blocks}, # CPU blocks: 256"]
    findings = found(lines, "oom.startup")
    assert [f.flag for f in findings] == ([flag] if flag else [])
    if flag == "--gpu-memory-utilization":
        assert findings[0].suggested == "0.95" and findings[0].evidence.facts["device_blocks"] == 0
    elif flag:
        f = findings[0]
        assert (f.current, f.evidence.facts["fits"]) == ("4096", (blocks * 16) // 256 * 256 or blocks * 16)
        assert f"{blocks} GPU blocks of 16 tokens hold {blocks * 16}" in f.message


def test_a_printed_block_size_is_the_one_counted() -> None:
    lines = [V0_CONFIG.format(block=", block_size=32"), "INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 200"]
    assert not found(lines, "oom.startup")  # 6,400 tokens hold 4,096


@pytest.mark.parametrize("between,named,fires", [(1, True, True), (10, True, True), (11, True, False),
                                                 (1, False, False)])
def test_the_cache_check_failing_right_after_the_blocks_says_the_context_does_not_fit(between: int, named: bool,
                                                                                     fires: bool) -> None:
    """OpenRLHF#336's form: `# GPU blocks: 378` then `Error executing method initialize_cache` and its traceback, cut
    before the error line, no max seq len in the log: the context that fits is 378 x 16 tokens (at most)."""
    head = "(LLMRayActor pid=20770) {} 06-28 06:11:45 worker_base.py:145] "
    method = "initialize_cache" if named else "execute_model"
    lines = [head.format("INFO") + "# GPU blocks: 378, # CPU blocks: 1638"]
    lines += [head.format("INFO") + "Waiting for workers."] * (between - 1)
    lines += [head.format("ERROR") + f"Error executing method {method}. This might cause deadlock in distributed "
              "execution.", head.format("ERROR") + "Traceback (most recent call last):"]
    findings = found(lines, "oom.startup")
    assert bool(findings) is fires
    if fires:
        (f,) = findings
        assert (f.flag, f.suggested, f.current) == ("--max-model-len", "5888 (or --gpu-memory-utilization higher)", None)
        assert "its length not in the log" in f.message


@pytest.mark.parametrize("gib,fires", [(-1.2, True), (0.0, True), (0.5, False)])
def test_kv_cache_memory_at_or_below_zero_is_no_room_for_the_kv_cache(gib: float, fires: bool) -> None:
    lines = VllmLog().start(kv_gb=gib, gpu_memory_utilization=0.8).lines
    findings = found(lines, "oom.startup")
    assert bool(findings) is fires
    if fires:
        assert (findings[0].flag, findings[0].suggested, findings[0].current) == (
            "--gpu-memory-utilization", "0.85", "0.8")


# -- OOM while capturing CUDA graphs, and in the sampler ---------------------------------------------------------

def _sglang_oom(*, capture_ended: bool, frame: str) -> list[str]:
    log = Log("0.4.9").add(lf.server_args(**ARGS), scheduler=False)
    log.add("Capture cuda graph begin. This can take up to several minutes.", dt=1)
    if capture_ended:
        log.add("Capture cuda graph end. Time elapsed: 12.34 s", dt=1)
    return log.add("Scheduler hit an exception: Traceback (most recent call last):\n"
                   f'  File "cuda_graph_runner.py", line 1, in {frame}\n' + CUDA_OOM, dt=1).lines


@pytest.mark.parametrize("ended,frame,rule", [
    (False, "run", "oom.graph_capture"),  # capture began and never ended
    (True, "capture_one_batch_size", "oom.graph_capture"),  # the traceback names the capture
    (True, "replay", "oom.other"),  # graphs were captured: an OOM while serving
])
def test_sglang_oom_during_graph_capture_halves_the_captured_maximum(ended: bool, frame: str, rule: str) -> None:
    findings = analyze(lines=_sglang_oom(capture_ended=ended, frame=frame)).findings
    ids = {f.id for f in findings}
    assert rule in ids and ({"oom.graph_capture", "oom.other"} - {rule}).isdisjoint(ids)
    if rule == "oom.graph_capture":
        (f,) = [f for f in findings if f.id == rule]
        assert (f.flag, f.current) == ("--cuda-graph-max-bs", "256")
        assert f.suggested == "128 (or --mem-fraction-static 0.80; or --disable-cuda-graph)"


def _vllm_oom(source: str, frame: str) -> list[str]:
    head = "(EngineCore_DP0 pid=7) ERROR 11-21 23:10:29 [core.py:700] "
    return [head + "EngineCore failed to start.", head + "Traceback (most recent call last):",
            head + VLLM_FILE.format(source, frame), head + CUDA_OOM]


def test_vllm_oom_during_graph_capture_offers_the_capture_size_memory_and_eager() -> None:
    (f,) = found(_vllm_oom("worker/gpu_model_runner.py", "capture_model"), "oom.graph_capture")
    assert (f.engine, f.flag, f.current) == ("vllm", "--max-cudagraph-capture-size", "512")
    assert f.suggested == "256 (or --gpu-memory-utilization lower; or --enforce-eager)"


@pytest.mark.parametrize("source,alternative", [("sample/sampler.py", "--max-num-seqs"),
                                                ("worker/gpu_model_runner.py", None)])
def test_vllm_oom_in_the_sampler_offers_a_lower_running_cap(source: str, alternative: str | None) -> None:
    (f,) = found(_vllm_oom(source, "forward"), "oom.other")
    assert f.flag == "--gpu-memory-utilization"
    assert (f.suggested == "0.85 (or --max-num-seqs lower)") is (alternative is not None)


# -- short excerpts: confidence, not silence ---------------------------------------------------------------------

def _decode_lines(n: int, *, queue: int | list[int] = 5, usage: float = 0.94) -> list[str]:
    queues = queue if isinstance(queue, list) else [queue] * n
    log = Log("0.5.5")
    for q in queues[:n]:
        log.add(lf.decode("0.5.5", running=6, token=int(usage * 2043), usage=usage, throughput=445.0, queue=q), dt=1)
    return log.lines


@pytest.mark.parametrize("n,confidence,severity", [(1, "low", "info"), (3, "low", "info"), (4, "medium", "warning"),
                                                   (9, "medium", "warning")])
def test_a_short_excerpt_with_a_full_pool_and_a_queue_gets_advice_with_its_confidence(
        n: int, confidence: str, severity: str) -> None:
    (f,) = found(_decode_lines(n), "capacity.pool_bound")
    assert (f.confidence, f.severity, f.evidence.count) == (confidence, severity, n)
    assert (f.flag, f.suggested) == ("--mem-fraction-static", "higher (or --kv-cache-dtype fp8_e5m2)")
    assert "a pool of about 20" in f.message and len(f.ranks) == 1


@pytest.mark.parametrize("lines", [_decode_lines(3, queue=0), _decode_lines(3, usage=0.89),
                                   _decode_lines(3, queue=[5, 0, 5])])
def test_a_short_excerpt_is_judged_only_when_every_line_shows_the_problem(lines: list[str]) -> None:
    d = analyze(lines=lines)
    assert not [f for f in d.findings if f.id == "capacity.pool_bound"]
    assert d.verdict.startswith("NOT ENOUGH DATA")


def test_a_short_vllm_excerpt_with_a_full_cache_and_waiting_requests_advises_more_gpu_memory() -> None:
    lines = VllmLog().start().stats_series(5, running=18, waiting=40, usage=0.96, gen=1000.0).lines
    (f,) = found(lines, "capacity.pool_bound")
    assert (f.flag, f.suggested, f.confidence, f.severity) == ("--gpu-memory-utilization", "0.95", "medium", "warning")
    assert f.evidence.seconds == 40.0


def _queued_lines(n: int, *, queue: int = 300, usage: float = 0.05) -> list[str]:
    log = Log("0.4.9").add(lf.server_args(**ARGS, chunked_prefill_size=2048, max_prefill_tokens=4096),
                           scheduler=False)
    for _ in range(n):
        log.add(lf.decode("0.4.9", running=8, token=int(usage * 665690), usage=usage, throughput=400.0, queue=queue),
                dt=1)
    return log.lines


@pytest.mark.parametrize("n,queue,usage,confidence", [(2, 300, 0.05, "low"), (5, 100, 0.1, "medium"),
                                                       (2, 99, 0.05, None), (2, 300, 0.11, None)])
def test_a_short_excerpt_with_hundreds_queued_at_an_empty_pool_raises_the_prefill_budget(
        n: int, queue: int, usage: float, confidence: str | None) -> None:
    findings = found(_queued_lines(n, queue=queue, usage=usage), "usage.prefill_bound")
    assert [f.confidence for f in findings] == ([confidence] if confidence else [])
    if confidence:
        (f,) = findings
        assert (f.flag, f.suggested, f.current) == ("--chunked-prefill-size", "8192 (with --max-prefill-tokens 8192)",
                                                    "2048")
        assert f.severity == ("info" if confidence == "low" else "warning")


def test_a_short_vllm_excerpt_with_hundreds_waiting_at_an_empty_cache_raises_the_step_budget() -> None:
    lines = VllmLog().start().stats_series(5, running=4, waiting=300, usage=0.02, gen=100.0).lines
    (f,) = found(lines, "usage.prefill_bound")
    assert (f.flag, f.suggested, f.confidence) == ("--max-num-batched-tokens", "16384", "medium")


def test_confidence_and_seconds_are_in_the_json_and_the_terminal_report() -> None:
    d = analyze(lines=_decode_lines(2))
    (f,) = [x for x in to_dict(d)["findings"] if x["id"] == "capacity.pool_bound"]
    assert f["confidence"] == "low" and f["evidence"]["seconds"] == 1.0 and f["evidence"]["count"] == 2
    out = io.StringIO()
    render(d, Console(file=out, width=200, color_system=None))
    assert "confidence: low" in out.getvalue() and "(1 s) on 1 rank" in out.getvalue()
    assert d.verdict.startswith("OK, with suggestions: KV pool full with requests waiting (1 info, low confidence)")


def test_findings_on_enough_lines_or_printed_errors_have_high_confidence() -> None:
    log = Log("0.4.9").start(**ARGS).decode_series(30, running=200, queue=8, usage=0.95)
    assert {f.confidence for f in analyze(lines=log.lines).findings} == {"high"}


# -- the corpus excerpts these rules were written for -----------------------------------------------------------

@pytest.mark.parametrize("name,rule,flag,suggested,confidence", [
    ("downstream/bonito-7-max-seq-len-kv", "oom.startup", "--max-model-len",
     "16640 (or --gpu-memory-utilization higher)", "high"),
    ("downstream/gptfuzz-27-max-seq-len-kv", "oom.startup", "--max-model-len",
     "1792 (or --gpu-memory-utilization higher)", "high"),
    ("downstream/product-catalog-10-max-seq-len-kv", "oom.startup", "--max-model-len",
     "3584 (or --gpu-memory-utilization higher)", "high"),
    ("downstream/tpu-inference-223-serve-one-request", "oom.startup", "--max-model-len",
     "5632 (or --gpu-memory-utilization higher)", "high"),
    ("vllm/vllm-16118-v1-quoted-serve-one-request", "oom.startup", "--max-model-len",
     "435456 (or --gpu-memory-utilization higher)", "high"),
    ("vllm/vllm-10517-max-seq-len-kv-29k", "oom.startup", "--max-model-len",
     "23552 (or --gpu-memory-utilization higher)", "high"),
    ("vllm/vllm-10439-compose-no-cache-blocks", "oom.startup", "--gpu-memory-utilization", "0.95", "high"),
    ("downstream/qanything-302-v0-zero-gpu-blocks", "oom.startup", "--gpu-memory-utilization", "0.95", "high"),
    ("vllm/vllm-9290-v0-multistep-cuda-oom", "oom.other", "--gpu-memory-utilization", "0.85", "high"),
    ("sglang/sglang-14972-tiny-pool-full", "capacity.pool_bound", "--mem-fraction-static",
     "higher (or --kv-cache-dtype fp8_e5m2)", "medium"),
    ("vllm/vllm-43295-v1-mtp-kv-full", "capacity.pool_bound", "--gpu-memory-utilization", "0.95", "medium"),
    # held-out batch 7
    ("downstream/haydeniw-dynamo-165-v1-128k-fits-56704-br", "oom.startup", "--max-model-len",
     "56704 (or --gpu-memory-utilization higher)", "high"),
    ("vllm/vllm-5079-max-seq-len-8192-kv-4688", "oom.startup", "--max-model-len",
     "4608 (or --gpu-memory-utilization higher)", "high"),
    ("vllm/vllm-25837-v1-free-memory-below-utilization", "oom.startup", "--gpu-memory-utilization", "0.80", "high"),
    ("sglang/sglang-5335-dp-attn-capture-0-21-gb", "gpu_memory.too_little", "--mem-fraction-static", "lower",
     "high"),
    ("downstream/limo-29-v0-preempted-101", "retraction.counted", "--gpu-memory-utilization", "0.95", "low"),
])
def test_corpus_excerpts_get_the_advice_an_expert_gives(name: str, rule: str, flag: str, suggested: str,
                                                        confidence: str) -> None:
    findings = [f for f in analyze([CORPUS / f"{name}.log"]).findings if f.id == rule]
    assert [(f.flag, f.suggested, f.confidence) for f in findings] == [(flag, suggested, confidence)]


@pytest.mark.parametrize("name", ["downstream/tt-vllm-55-v0-heartbeat-kv-high",
                                  "vllm/vllm-21809-v1-kv-filling-no-queue", "vllm/vllm-3094-v0-single-stats-pending",
                                  "sglang/sglang-2255-chunked-prefill-queue"])
def test_short_corpus_excerpts_without_a_queue_behind_a_full_pool_get_no_pool_advice(name: str) -> None:
    assert not [f for f in analyze([CORPUS / f"{name}.log"]).findings if f.id == "capacity.pool_bound"]


# -- vLLM: room outside its memory budget for the CUDA graphs it captures -------------------------------------

PROFILE = ("(RayWorkerWrapper pid=1463574, ip=192.168.10.60) INFO 03-27 10:29:01 [worker.py:267] the current vLLM "
           "instance can use total_gpu_memory ({total}GiB) x gpu_memory_utilization ({util}) = {used}GiB")


@pytest.mark.parametrize("total,util,suggested", [(44.53, 0.98, "0.95"), (44.53, 0.97, None), (23.58, 0.99, "0.91"),
                                                  (80.0, 0.99, "0.97"), (80.0, 0.98, None)])
def test_a_utilization_that_leaves_under_a_gib_outside_vllms_budget_risks_graph_capture(
        total: float, util: float, suggested: str | None) -> None:
    """vllm#15598: 0.98 of 44.53 GiB leaves 0.89 GiB for the graphs captured after the KV cache (then OOM); 0.97
    leaves 1.34. The advice leaves 2 GiB."""
    findings = found([PROFILE.format(total=total, util=util, used=round(total * util, 2))], "gpu_memory.no_room_for_graphs")
    assert [f.suggested for f in findings] == ([f"{suggested} (or --enforce-eager)"] if suggested else [])
    if suggested:
        f = findings[0]
        assert (f.flag, f.current, f.severity, f.confidence) == ("--gpu-memory-utilization", f"{util:g}", "info", "low")
        assert f.evidence.facts["outside_gb"] == round(total * (1 - util), 2)


def test_eager_mode_captures_no_graphs_to_make_room_for() -> None:
    config = ("INFO 03-27 10:28:01 llm_engine.py:70] Initializing an LLM engine with config: model='m', "
              "max_seq_len=4096, enforce_eager=True, tensor_parallel_size=1")
    assert not found([config, PROFILE.format(total=44.53, util=0.98, used=43.64)], "gpu_memory.no_room_for_graphs")


def test_blocks_and_a_traceback_with_its_own_error_line_are_that_error() -> None:
    """V0's `initialize_cache` also warms up and captures graphs: its traceback ending in a CUDA OOM is the OOM's
    (`oom.graph_capture`), not a context that does not fit."""
    head = "(RayWorkerWrapper pid=7) {} 06-28 06:11:45 worker_base.py:145] "
    lines = [head.format("INFO") + "# GPU blocks: 2000, # CPU blocks: 1638",
             head.format("ERROR") + "Error executing method initialize_cache. This might cause deadlock in distributed "
             "execution.", head.format("ERROR") + "Traceback (most recent call last):",
             head.format("ERROR") + '  File "/v/worker/model_runner.py", line 1, in capture_model',
             head.format("ERROR") + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    ids = {f.id for f in analyze(lines=lines).findings}
    assert "oom.startup" not in ids and "oom.graph_capture" in ids


@pytest.mark.parametrize("after,device", [("stats", "GPU"), (None, "HPU")])
def test_blocks_below_the_max_seq_len_are_not_judged_where_the_server_ran_or_the_block_size_is_unknown(
        after: str | None, device: str) -> None:
    """A server that went on to serve started (the check passed: a block size other than 16); a device other
    than a GPU has another default block size (vllm-fork's HPU: 128)."""
    lines = [V0_CONFIG.format(block=""), f"INFO 04-27 10:13:05 llm_engine.py:275] # {device} blocks: 200, # CPU blocks: 256"]
    if after:
        lines.append("INFO 04-27 10:13:15 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Avg generation "
                     "throughput: 80.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
                     "usage: 1.0%, CPU KV cache usage: 0.0%")
    assert not found(lines, "oom.startup")


def test_a_capture_the_log_shows_done_fitted() -> None:
    graphs = "INFO 03-27 10:29:30 [model_runner.py:1570] Graph capturing finished in 12 secs, took 0.45 GiB"
    profile = PROFILE.format(total=80.0, util=0.99, used=79.2)
    assert found([profile], "gpu_memory.no_room_for_graphs")
    assert not found([profile, graphs], "gpu_memory.no_room_for_graphs")


# -- held-out batch 7: a capture's progress bar, less free memory than asked, a counter without time -----------

PROGRESS = "Capturing batches ({}avail_mem={} GB):   0%|          | 0/4 [00:02<?, ?it/s]"


@pytest.mark.parametrize("bs", ["", "bs=4 "])
@pytest.mark.parametrize("avail,rule", [(0.21, "gpu_memory.too_little"), (4.99, "gpu_memory.too_little"),
                                        (5.0, None), (12.0, None), (12.01, "gpu_memory.too_much")])
def test_a_capture_progress_bar_says_what_capture_began_with(bs: str, avail: float, rule: str | None) -> None:
    """SGLang 0.4.5+ prints its capture's progress (sglang#5335: the only capture line of the paste): too little is
    judged on it, too much on it less the graphs' allowance (4 GB), as on `Capture cuda graph begin`."""
    d = analyze(lines=[PROGRESS.format(bs, avail)])
    assert d.stats.kinds["graph_progress"] == 1 and d.config.engine == "sglang"
    assert d.config.before_graphs_gb == avail
    assert [f.id for f in d.findings if f.id.startswith("gpu_memory")] == ([rule] if rule else [])


def test_an_oom_after_a_capture_progress_bar_is_an_oom_in_capture() -> None:
    lines = [PROGRESS.format("bs=8 ", 6.5), "[2025-04-13 02:02:20 TP0] " + CUDA_OOM]
    assert [f.id for f in analyze(lines=lines).findings if f.id.startswith("oom")] == ["oom.graph_capture"]


@pytest.mark.parametrize("prefix", ["(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] ", ""])
@pytest.mark.parametrize("device", ["", "cuda:0 "])  # later vLLM names the device
@pytest.mark.parametrize("free,total,util,suggested", [(3.22, 4.0, 0.9, "0.80"), (70.0, 79.1, 0.9, "0.88"),
                                                       (0.5, 80.0, 0.9, "0.00")])
def test_less_free_memory_than_the_utilization_asks_for_advises_the_share_that_fits(
        prefix: str, device: str, free: float, total: float, util: float, suggested: str) -> None:
    """vLLM V1 refuses to start where less is free than utilization x total (vllm#25837): the share of the total
    that was free, rounded down to a hundredth; only the direction where not even a hundredth was free. The
    wording alone names vLLM (its flag, not SGLang's)."""
    line = (f"{prefix}ValueError: Free memory on device {device}({free}/{total} GiB) on startup is less than desired "
            f"GPU memory utilization ({util}, {round(util * total, 2)} GiB). Decrease GPU memory utilization or "
            "reduce GPU memory used by other processes.")
    (f,) = found([line], "oom.startup")
    want = "lower" if suggested == "0.00" else suggested
    assert (f.flag, f.suggested, f.current) == ("--gpu-memory-utilization", want, f"{util:g}")
    assert f.evidence.facts["free_gb"] == free


@pytest.mark.parametrize("prefix", ["[Worker_TP1] [gpu_worker.py:859] ",
                                    "(Worker_TP1 pid=7) INFO 09-15 10:00:00 [gpu_worker.py:859] ", ""])
def test_the_free_memory_summary_of_a_start_up_that_fits_is_no_error(prefix: str) -> None:
    """Newer vLLM prints `Free memory on device (...) on startup.` in an INFO summary of a start-up that fits
    (rtx6kpro#103): not the refusal (`... on startup is less than desired ...`), no finding."""
    line = (f"{prefix}Free memory on device (93.79/94.97 GiB) on startup. Desired GPU memory "
            "utilization is (0.975, 92.6 GiB). Actual usage is 83.1 GiB for consumed memory (weights + non-torch), "
            "1.24 GiB for peak activation, and 0.2 GiB for CUDAGraph memory.")
    d = analyze(lines=[line])
    assert "not_enough_memory" not in d.stats.kinds and not d.findings


@pytest.mark.parametrize("counter,rule", [(1, None), (50, None), (51, "retraction.counted"),
                                          (101, "retraction.counted")])
def test_a_v0_preemption_counter_without_time_is_advice_at_low_confidence(counter: int, rule: str | None) -> None:
    """limo#29 pasted one warning, no prefix, at `total_num_cumulative_preemption=101`: from V0's second warning
    on (more than 50 preemptions) an info at low confidence; with stamps the rate decides (`retraction.frequent`)."""
    line = (" Sequence group 221 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
            "space. This can affect the end-to-end performance. Increase gpu_memory_utilization or "
            f"tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={counter}")
    d = analyze(lines=[line])
    assert d.stats.kinds["preempt"] == 1
    findings = [f for f in d.findings if f.id.startswith("retraction")]
    assert [(f.id, f.severity, f.confidence) for f in findings] == ([(rule, "info", "low")] if rule else [])


@pytest.mark.parametrize("numbers", ["3.22/. GiB) on startup is less than desired GPU memory utilization (0.9",
                                     "3.22/4.0 GiB) on startup is less than desired GPU memory utilization (0.9.1"])
def test_a_garbled_free_memory_error_is_still_a_start_up_error_without_its_numbers(numbers: str) -> None:
    d = analyze(lines=[f"ValueError: Free memory on device ({numbers}, 3.6 GiB)."])
    assert [f.id for f in d.findings] == ["oom.startup"] and not any("rule-error" in n for n in d.notes)


@pytest.mark.parametrize("lines,began", [
    # later bars show less free memory as graphs are captured: the begin line, else the first bar, says it
    (["[2025-04-13 02:02:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.00 GB",
      PROGRESS.format("bs=8 ", 19.8), PROGRESS.format("bs=4 ", 4.1)], 20.0),
    ([PROGRESS.format("bs=8 ", 19.8), PROGRESS.format("bs=4 ", 4.1)], 19.8),
])
def test_what_capture_began_with_is_its_begin_line_or_its_first_bar(lines: list[str], began: float) -> None:
    d = analyze(lines=lines)
    assert d.config.before_graphs_gb == began
    assert [f.id for f in d.findings if f.id.startswith("gpu_memory")] == ["gpu_memory.too_much"]


# https://github.com/sgl-project/sglang/issues/33483: the capture's begin line lists its batch sizes; the pool line
# glued to the capture's end by the paste
CAPTURE_BEGIN = ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[{sizes}], avail "
                 "mem=7.10 GB")
CAPTURE_END = ("Capture target decode CUDA graph end. elapsed=0.89 s, mem usage=0.15 GB, avail mem=6.95 GB "
               "max_total_num_tokens=2980168, chunked_prefill_size=4096, max_prefill_tokens=16384, "
               "max_running_requests={cap}, context_len=32768, available_gpu_mem=6.95 GB")


def _sizes(largest: int) -> str:
    return ", ".join(str(b) for b in (1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256, 512) if b < largest) + f", {largest}"


@pytest.mark.parametrize("largest,cap,advised", [(32, 4096, "64"), (32, 128, "64"), (32, 127, None),
                                                 (128, 4096, "256"), (256, 4096, None)])
def test_graphs_far_below_the_running_cap_at_start_up_are_low_confidence_advice(largest: int, cap: int,
                                                                                 advised: str | None) -> None:
    """Graphs to 32 against a cap of 4,096 (sglang#33483), no load line: info at low confidence, the next power of
    two above twice the graphs; a cap below 4x the graphs, or graphs to 256 and more, say nothing."""
    d = analyze(lines=[CAPTURE_BEGIN.format(sizes=_sizes(largest)), CAPTURE_END.format(cap=cap)])
    assert (d.config.captured_max_bs, d.config.max_running_requests, d.config.max_total_num_tokens) == (
        largest, cap, 2980168)
    findings = [f for f in d.findings if f.id == "cuda_graph.below_cap"]
    if advised is None:
        assert findings == []
    else:
        (f,) = findings
        assert (f.severity, f.confidence, f.flag, f.suggested, f.current) == (
            "info", "low", "--cuda-graph-max-bs", advised, str(largest))


def test_graphs_below_the_cap_say_nothing_where_load_lines_show_the_batch() -> None:
    decode = ("[2025-01-01 00:00:{s:02d}] Decode batch, #running-req: 20, #token: 9000, token usage: 0.30, "
              "cuda graph: True, gen throughput (token/s): 812.55, #queue-req: 0,")
    lines = [CAPTURE_BEGIN.format(sizes=_sizes(32)), CAPTURE_END.format(cap=4096)]
    d = analyze(lines=lines + [decode.format(s=s) for s in range(5)])
    assert "cuda_graph.below_cap" not in {f.id for f in d.findings}


@pytest.mark.parametrize("begin", [
    CAPTURE_BEGIN.replace("target decode", "draft"),  # the draft model's graphs
    CAPTURE_BEGIN.replace("decode", "prefill"),  # prefill graphs list token counts
    CAPTURE_BEGIN.replace("{sizes}]", "{sizes}"),  # a list cut by the paste: its largest is unknown
])
def test_only_a_whole_list_of_the_target_models_decode_graphs_is_the_captured_maximum(begin: str) -> None:
    d = analyze(lines=[begin.format(sizes=_sizes(32)), CAPTURE_END.format(cap=4096)])
    assert d.config.captured_max_bs is None and "cuda_graph.below_cap" not in {f.id for f in d.findings}


def test_a_pool_line_glued_to_the_captures_end_in_its_older_spelling_is_read() -> None:
    end = CAPTURE_END.format(cap=64).replace("max_total_num_tokens=", "max_total_num_token=")
    assert analyze(lines=[end]).config.max_total_num_tokens == 2980168


# https://github.com/sgl-project/sglang/issues/2777: one request per prefill while 57-62 wait, the usage rising 0.01
# per ~60 prompt tokens
PREFILL = ("[2025-01-07 20:16:{s:02d} TP0] Prefill batch. #new-seq: {seqs}, #new-token: {tokens}, #cached-token: 0, "
           "cache hit rate: 0.00%, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}")


def _prefills(pool: int, n: int = 7, queue: int = 62, gap_s: int = 0, finished_at: int | None = None,
              tokens: int = 60) -> list[str]:
    """n prefill lines of one request of `tokens` each, the usage each prints the tokens before it over `pool`."""
    lines, held, running = [], 0, 0
    for i in range(n):
        if i == finished_at:
            running -= 1  # a request finished between two lines (its tokens stay, as they may for a while)
        lines.append(PREFILL.format(s=i * gap_s, seqs=1, tokens=tokens, usage=held / pool, running=running,
                                    queue=max(0, queue - i)))
        held, running = held + tokens, running + 1
    return lines


@pytest.mark.parametrize("lines,fires", [
    (_prefills(5400), True),
    (_prefills(15000, tokens=200), True),  # 1,200 tokens raise the usage by 0.08: ~15,000
    (_prefills(20000, tokens=200), False),  # by 0.06: ~20,000, not small
    (_prefills(17000), False),  # 360 tokens raise the usage by 0.02: below the rise read to 10%
    (_prefills(5400, queue=0), False),  # nothing waits
    (_prefills(5400, n=2), False),  # two lines: too few
    (_prefills(5400, gap_s=2), False),  # 12 s of lines: decoding in between fills the pool too
    (_prefills(5400, finished_at=3), False),  # a request finished within the first lines: the run is too short
    (["[2025-01-07 20:15:00] max_total_num_tokens=5400, chunked_prefill_size=8192, max_prefill_tokens=16384, "
      "max_running_requests=4096, context_len=8192, available_gpu_mem=2.00 GB"] + _prefills(5400), False),
])
def test_a_burst_of_prefills_that_implies_a_tiny_pool_asks_for_more_kv_memory(lines: list[str], fires: bool) -> None:
    """Where the log does not size the pool: the tokens prefilled over the usage's rise, while only requests join,
    below 16,384 tokens with a queue (sglang#2777: ~5,400)."""
    found = [f for f in analyze(lines=lines).findings if f.id == "capacity.small_pool"]
    assert bool(found) is fires
    if fires:
        (f,) = found
        assert (f.flag, f.suggested, f.confidence) == ("--mem-fraction-static", "higher", "medium")


def test_three_prefill_lines_implying_a_tiny_pool_are_low_confidence_info() -> None:
    (f,) = [f for f in analyze(lines=_prefills(5400, n=3, tokens=200)).findings if f.id == "capacity.small_pool"]
    assert (f.severity, f.confidence) == ("info", "low")


def test_sglangs_loaded_weights_leave_no_memory_refusal_raises_the_fraction() -> None:
    """SGLang 0.5's wording (InferenceX#2128), its fraction from the launch command pasted in a sentence (with
    elisions): `oom.startup` 0.05 higher."""
    lines = ["The scripts launch `sglang serve … --tp 8 … --mem-fraction-static 0.88`. On an H200 the weights ...",
             "Load weight end. quant=fp8, fmt=e4m3, avail mem=12.25 GB, mem usage=125.65 GB.",
             "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88."]
    d = analyze(lines=lines)
    (f,) = d.findings
    assert (f.id, f.flag, f.suggested, f.current) == ("oom.startup", "--mem-fraction-static", "0.93", "0.88")
    assert d.config.model is None  # `…` is an elision, no model


# https://github.com/kaito-project/kaito/issues/2132: vLLM's refusal wrapped over three lines by the paste
WRAPPED = ["ValueError: To serve at least one request with the model's max seq len (1048576),",
           "22.5 GiB KV cache is needed, which is larger than the available KV cache memory (17.39 GiB).",
           "Based on the available memory, the estimated maximum model length is 810208."]


@pytest.mark.parametrize("lines", [WRAPPED, [" ".join(WRAPPED)]], ids=["wrapped", "one line"])
def test_a_max_seq_len_refusal_wrapped_by_the_paste_is_one_message_with_its_estimate(lines: list[str]) -> None:
    d = analyze(lines=lines)
    assert d.stats.kinds["not_enough_memory"] == 1 and d.stats.other == 0
    (f,) = d.findings
    assert (f.id, f.flag) == ("oom.startup", "--max-model-len") and f.suggested.startswith("810208")


def test_a_wrapped_refusals_next_message_is_its_own() -> None:
    """Only the refusal's own words continue it: the next engine message after it is read on its own."""
    lines = [WRAPPED[0], "(APIServer pid=1) INFO 07-02 08:34:45 [loggers.py:273] Engine 000: Avg prompt throughput: "
             "1.0 tokens/s, Avg generation throughput: 2.1 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache "
             "usage: 0.0%, Prefix cache hit rate: 0.0%"]
    assert analyze(lines=lines).stats.kinds == {"not_enough_memory": 1, "stats": 1}
