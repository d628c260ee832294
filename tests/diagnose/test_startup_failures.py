"""Start-up failures users paste (held-out batch 13, tests/diagnose/real_logs/README.md): how their lines are read
(a traceback after other text, after a progress bar, or without its head; SGLang 0.1's `[rank=N] ` lines, piecewise
CUDA-graph capture) and the advice each gets, across each rule's threshold on synthetic lines and on the excerpts."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.read.lines import ParseStats, parse_lines
from toolkit.diagnose.rules.oom import PEAK_SHARE, WEIGHTS_FILL
from toolkit.diagnose.rules.running_cap import ROOM_FACTOR, TINY_CAP
from toolkit.diagnose.rules.workarounds import HUGE_CONTEXT

REAL = Path(__file__).parent / "real_logs"
FRAMES = ['  File "/x/vllm/worker/model_runner.py", line 1395, in capture_model',
          '    graph_runner.capture(**capture_inputs)',
          '  File "/x/torch/cuda/graphs.py", line 84, in capture_end',
          '    super().capture_end()']
OOM_LINE = "RuntimeError: CUDA error: out of memory"


def _kinds(lines: list[str]) -> dict[str, int]:
    stats = ParseStats()
    events = list(parse_lines(lines, stats=stats))
    return {kind: sum(e.kind == kind for e in events) for kind in {e.kind for e in events}}


def _flags(d) -> dict[str, tuple[str | None, str | None]]:
    return {f.id: (f.flag, f.suggested) for f in d.findings}


# -- reading ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["Initialization failed. router_init_state: Traceback (most recent call last):",
                                  "`Traceback (most recent call last):"])
def test_a_traceback_head_after_other_text_opens_the_exception_there(line: str) -> None:
    """sglang#485 (SGLang 0.1 printing the router's traceback after its state) and vllm#2785 (a backtick)."""
    events = list(parse_lines([line, *FRAMES, "ValueError: bad"]))
    assert [e.kind for e in events] == ["exception"] and events[0].text.startswith("Traceback")


def test_a_traceback_printed_after_a_progress_bar_is_its_own_record() -> None:
    """A progress bar's line ends in no newline: the traceback runs on in it (sglang#14476); the bar is still
    read (a piecewise capture's, with its token count)."""
    bar = ("Capturing num tokens (num_tokens=3968 avail_mem=0.05 GB):   2%|#   | 1/58 [00:00<00:56,  1.01it/s]"
           "Traceback (most recent call last):")
    events = list(parse_lines([bar, *FRAMES, "RuntimeError: boom"]))
    assert [e.kind for e in events] == ["graph_progress", "exception"]
    assert events[0].fields == {"avail_mem": 0.05, "num_tokens": 3968}
    assert _kinds(["text 1.01it/s] no traceback here"]) == {}


@pytest.mark.parametrize("prefix", ["", "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] "])
def test_a_traceback_without_its_head_counts_by_its_error_line(prefix: str) -> None:
    """An excerpt that begins inside a traceback (vllm#19186): its frames are one record, counted as the corpus
    counts a tail, by its error line alone (an OOM); its frames say where (here: graph capture). Without an error
    line the frames are nothing (trl#3310); the tail ends at its error line (gpustack#1800: a whole traceback
    follows)."""
    lines = [prefix + line for line in [*FRAMES, OOM_LINE]]
    events = list(parse_lines(lines))
    assert [e.kind for e in events] == ["oom"] and "capture_end" in events[0].text
    assert _kinds([prefix + line for line in FRAMES]) == {}
    after = [*lines, "Process SpawnProcess-1:", "Traceback (most recent call last):", *FRAMES, "ValueError: x"]
    assert _kinds(after) == {"oom": 1, "exception": 1}


def test_a_frame_after_the_log_began_is_no_record() -> None:
    """Once an event was read, a stray frame line (another process's, interleaved) opens nothing."""
    head = "[2025-05-29 14:59:00 TP0] Load weight begin. avail mem=78.81 GB"
    assert _kinds([head, *FRAMES, OOM_LINE]) == {"load_begin": 1, "oom": 1}


def test_sglang_0_1_rank_lines_give_the_memory_before_and_after_the_weights() -> None:
    d = analyze(lines=["[rank=1] Init torch begin. Avail mem=78.81 GB",
                       "[rank=1] Load weight end. Type=LlavaQwenForCausalLM. Avail mem=5.59 GB"])
    assert (d.config.gpu_mem_gb, d.config.weight_mem_gb) == (78.81, 73.22)
    assert {e.rank for e in d.timeline.kind("load_end")} == {"TP1"}


# -- advice ----------------------------------------------------------------------------------------------------

def _sglang_weights(left: float, *, pool: bool = False, error: str | None = None) -> list[str]:
    lines = ["[rank=0] Init torch begin. Avail mem=80.00 GB", f"[rank=0] Load weight end. Type=M. Avail mem={left} GB"]
    if pool:
        lines.append("[2024-05-27 22:30:05 TP0] Memory pool end. avail mem=2.00 GB")
    return [*lines, "Initialization failed. router_init_state: Traceback (most recent call last):", *FRAMES,
            *([error] if error else [])]


@pytest.mark.parametrize("left,fires", [(80 * (1 - WEIGHTS_FILL) - 0.1, True), (80 * (1 - WEIGHTS_FILL) + 0.1, False)])
def test_weights_that_leave_less_than_the_reserve_advise_a_higher_static_fraction(left: float, fires: bool) -> None:
    d = analyze(lines=_sglang_weights(round(left, 2)))
    found = _flags(d).get("oom.startup")
    assert (found is not None) is fires
    if fires:
        assert found[0] == "--mem-fraction-static" and float(found[1].split()[0]) > 1 - left / 80


def test_a_pool_made_after_the_weights_is_no_weights_failure() -> None:
    assert "oom.startup" not in _flags(analyze(lines=_sglang_weights(5.0, pool=True)))


@pytest.mark.parametrize("error,fires", [(None, True), ("RuntimeError: Not enough memory. Please try to increase "
                                                        "--mem-fraction-static.", True),
                                         ("ImportError: cannot import name 'flash_attn_varlen_func'", False)])
def test_only_a_crash_cut_before_its_error_or_naming_memory_is_put_on_the_weights(error: str | None,
                                                                                  fires: bool) -> None:
    assert ("oom.startup" in _flags(analyze(lines=_sglang_weights(5.0, error=error)))) is fires


@pytest.mark.parametrize("fraction,fires", [(0.9, True), (0.95, False)])
def test_a_static_fraction_whose_reserve_fits_what_is_left_is_not_blamed(fraction: float, fires: bool) -> None:
    """5 of 80 GB left: a fraction of 0.9 keeps 8 GB back (more than is left); 0.95 keeps 4 GB (it fits)."""
    args = f"[2024-05-27 22:30:00] server_args=ServerArgs(model_path='m', mem_fraction_static={fraction}, tp_size=1)"
    assert ("oom.startup" in _flags(analyze(lines=[args, *_sglang_weights(5.0)]))) is fires


def test_the_corpus_72b_on_four_gpus_gets_a_higher_static_fraction() -> None:
    d = analyze([REAL / "sglang" / "sglang-485-llava-qwen-72b-avail-mem.log"])
    assert _flags(d)["oom.startup"] == ("--mem-fraction-static", "0.95 (or --tp-size higher)")


def _vllm_profile(peak: float) -> list[str]:
    return ["INFO 02-26 09:54:05 worker.py:267] the current vLLM instance can use total_gpu_memory (8.00GiB) x "
            "gpu_memory_utilization (0.70) = 5.60GiB",
            f"INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch "
            f"activation peak memory takes {peak:.2f}GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
            "INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681",
            "INFO 02-26 09:54:05 executor_base.py:116] Maximum concurrency for 4096 tokens per request: 0.00x"]


@pytest.mark.parametrize("share,fires", [(PEAK_SHARE + 0.01, True), (PEAK_SHARE - 0.01, False)])
def test_a_large_activation_peak_adds_a_shorter_max_model_len(share: float, fires: bool) -> None:
    f = next(f for f in analyze(lines=_vllm_profile(share * 5.6)).findings if f.id == "oom.startup")
    assert f.flag == "--gpu-memory-utilization"
    assert ("--max-model-len 2048" in f.suggested) is fires


def _mm(*after: str, seqs: int | None = 128) -> list[str]:
    command = ["vllm serve m --max-model-len 512" + (f" --max-num-seqs {seqs}" if seqs else "")]
    return [*command, "INFO 10-24 18:12:26 model_runner.py:1067] Loading model weights took 19.8557 GB",
            "INFO 10-24 18:12:26 enc_dec_model_runner.py:301] Starting profile run for multi-modal models.", *after]


@pytest.mark.parametrize("concurrency,suggested", [(70.38, "64"), (127.9, "64"), (128.0, None), (0.5, None)])
def test_a_multimodal_profile_that_leaves_fewer_requests_than_max_num_seqs(concurrency: float,
                                                                           suggested: str | None) -> None:
    d = analyze(lines=_mm("INFO 10-24 18:12:39 gpu_executor.py:122] # GPU blocks: 2252, # CPU blocks: 1638",
                          f"INFO 10-24 18:12:39 gpu_executor.py:126] Maximum concurrency for 512 tokens per request: "
                          f"{concurrency}x"))
    assert _flags(d).get("multimodal.profile", (None, None))[1] == suggested


@pytest.mark.parametrize("seqs,suggested", [(None, "64"), (32, "8"), (4, "1"), (3, None)])
def test_a_multimodal_profile_run_that_fails_start_up_lowers_max_num_seqs(seqs: int | None,
                                                                          suggested: str | None) -> None:
    crash = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/x/vllm/executor/gpu_executor.py", line 114, in determine_num_available_blocks',
             "[rank0]:     return self.driver_worker.determine_num_available_blocks()"]
    assert _flags(analyze(lines=_mm(*crash, seqs=seqs))).get("multimodal.profile", (None, None))[1] == suggested
    assert "multimodal.profile" not in _flags(analyze(lines=_mm(*crash[:1], seqs=seqs)))  # not through the profile
    other = [*crash, "[rank0]: ValueError: the image processor expects 4 channels"]
    assert "multimodal.profile" not in _flags(analyze(lines=_mm(*other, seqs=seqs)))  # no memory error


def test_the_corpus_mllama_excerpts_lower_max_num_seqs() -> None:
    for name, suggested in (("vllm-10569-mllama-profile-256-images", "64"), ("vllm-9630-mllama-h100-2252-blocks", "64")):
        assert _flags(analyze([REAL / "vllm" / f"{name}.log"]))["multimodal.profile"] == ("--max-num-seqs", suggested)


def _pool(cap: int, tokens: int, context: int = 8192) -> list[str]:
    return [f"[2026-02-27 17:10:29 TP0] max_total_num_tokens={tokens}, chunked_prefill_size=2048, max_prefill_tokens="
            f"16384, max_running_requests={cap}, context_len={context}, available_gpu_mem=6.63 GB"]


@pytest.mark.parametrize("cap,tokens,suggested", [
    (1, 580364, "64"), (TINY_CAP, ROOM_FACTOR * TINY_CAP * 8192, "32"), (TINY_CAP + 1, 10**7, None),
    (TINY_CAP, ROOM_FACTOR * TINY_CAP * 8192 - 1, None)])
def test_a_tiny_running_cap_beside_a_large_pool_is_named(cap: int, tokens: int, suggested: str | None) -> None:
    found = _flags(analyze(lines=_pool(cap, tokens))).get("running_cap.tiny", (None, None))
    assert found[1] == suggested
    if suggested:
        f = next(f for f in analyze(lines=_pool(cap, tokens)).findings if f.id == "running_cap.tiny")
        assert (f.severity, f.confidence, f.current) == ("info", "low", str(cap))


def _startup_crash(context: int) -> list[str]:
    return [f"python3 -m sglang.launch_server --model-path m --tp 8 --context-length {context}",
            "[2025-05-29 14:59:00 TP5] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/s/python/sglang/srt/model_executor/model_runner.py", line 233, in __init__',
            "    self.initialize(min_per_gpu_memory)"]


@pytest.mark.parametrize("context,fires", [(HUGE_CONTEXT + 1, True), (HUGE_CONTEXT, False)])
def test_a_start_up_crash_with_a_huge_context_length_lowers_it(context: int, fires: bool) -> None:
    f = next(f for f in analyze(lines=_startup_crash(context)).findings if f.id == "crash.exception")
    assert (f.flag == "--context-length") is fires
    if fires:
        assert (f.suggested, f.current) == (str(HUGE_CONTEXT // 8), str(context))


def test_a_failed_piecewise_capture_offers_smaller_piecewise_graphs() -> None:
    d = analyze([REAL / "sglang" / "sglang-14476-olmo-piecewise-graph-oom.log"])
    assert _flags(d)["gpu_memory.too_little"] == ("--mem-fraction-static",
                                                  "lower (or --piecewise-cuda-graph-max-tokens 1984)")
    batches = ["[2025-12-05 10:00:00 TP0] Capturing batches (bs=160 avail_mem=0.05 GB):   2%|#  | 1/58 [00:00<00:56, "
               "1.01it/s]"]
    assert _flags(analyze(lines=batches))["gpu_memory.too_little"] == ("--mem-fraction-static", "lower")


# -- short excerpts of a light load (held-out batch 14) -----------------------------------------------------

def _eager(running: list[int], model: str = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", tp: int = 2) -> list[str]:
    command = [f"vllm serve {model} --tensor-parallel-size {tp} --max-model-len 8192 --enforce-eager"]
    return command + [f"INFO 01-30 16:15:{44 + 5 * i} metrics.py:453] Avg prompt throughput: 0.0 tokens/s, Avg generation "
                      f"throughput: 32.5 tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: "
                      f"1.4%, CPU KV cache usage: 0.0%." for i, r in enumerate(running)]


@pytest.mark.parametrize("running,fires", [([1, 1, 1], True), ([300, 300], False), ([0, 0], False)])
def test_a_short_excerpt_with_graphs_off_at_a_small_batch_is_advised_at_low_confidence(running: list[int],
                                                                                       fires: bool) -> None:
    """llama.cpp#11474: a pasted `--enforce-eager` launch and three stats lines of one request (too few steady lines
    for the full rule): graphs on, at the confidence three lines carry; a batch above 256, or nothing running, no."""
    f = next((f for f in analyze(lines=_eager(running)).findings if f.id == "cuda_graph.disabled"), None)
    assert (f is not None) is fires
    if fires:
        assert (f.flag, f.suggested, f.severity, f.confidence) == ("--enforce-eager", "remove (graphs on)", "info", "low")


@pytest.mark.parametrize("model", ["qwen2.5-1.5B-wspo", "Qwen2.5-4B", "/models/Qwen2.5-1.5B-Instruct/"])
def test_a_model_name_is_no_measurement_of_its_weights(model: str) -> None:
    """arena-hard-auto#81: a 1.5B model at TP 2 with no weights line. The parameter count a name seems to say, against
    a GPU the log does not size, stood for no signal of the log's own (issue 49): no replica advice from it."""
    assert "parallelism.dp_over_tp" not in _flags(analyze(lines=_eager([2, 1], model=model)))


# -- held-out batch 15 ------------------------------------------------------------------------------------------

def _off(running: list[int], graph: str = "False") -> list[str]:
    return [f"[2025-08-10 10:00:0{i}] Decode batch. #running-req: {r}, #token: 9000, token usage: 0.05, cuda graph: "
            f"{graph}, gen throughput (token/s): 300.00, #queue-req: 0" for i, r in enumerate(running)]


@pytest.mark.parametrize("lines,suggested", [
    (_off([20, 20, 19]), "32"),              # mineru#3470: every line off at 20 running
    (_off([128]), "128"),                    # sglang#29853: one line is a step that ran eagerly (low confidence)
    (_off([256]), "256"),
    (_off([257]), None),                     # above 256: graphs are not for such batches
    (_off([300, 300, 300]), None),
    (_off([0]), None),                       # nothing ran
    ([line.replace("cuda graph", "accept len: 1.50, cuda graph") for line in _off([45])], None),  # sglang#25960
    (_off([20, 20, 19], graph="True"), None),
])
def test_a_short_excerpt_whose_every_line_ran_without_a_graph(lines: list[str], suggested: str | None) -> None:
    f = next((f for f in analyze(lines=lines).findings if f.id == "cuda_graph.not_used"), None)
    assert (f.suggested if f else None) == (None if suggested is None else f"{suggested} (or --disable-cuda-graph "
                                                                             "remove (graphs on))")
    if f is not None and len(lines) == 1:
        assert (f.severity, f.confidence) == ("info", "low") and "the one decode step" in f.message


def test_a_logging_config_s_source_and_level_after_the_stamp_are_prefix() -> None:
    """sglang#22877: `[time][file.py:N][LEVEL]: ` before the message."""
    line = ("[2026-04-15 17:13:10][scheduler_metrics_mixin.py:424][INFO]: Prefill batch, #new-seq: 1, #new-token: 1, "
            "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #prealloc-req: 18, cuda graph: False")
    (e,) = parse_lines([line])
    assert (e.kind, e.text[:14], e.fields["new_seq"]) == ("prefill", "Prefill batch,", 1)


# -- vLLM's KV cache memory check, cut by the excerpt -------------------------------------------------------------

KV_CHECK = ['  File "/x/vllm/v1/core/kv_cache_utils.py", line 943, in get_kv_cache_config',
            "    check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory)"]
REFUSAL = ("ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (4.25 GiB). Based on the available memory, "
           "the estimated maximum model length is 99744. Try increasing `gpu_memory_utilization` or decreasing "
           "`max_model_len` when initializing the engine.")
VLLM = "(EngineCore pid=316) ERROR 07-09 17:59:40 [core.py:586] "


@pytest.mark.parametrize("tail,kinds", [
    (KV_CHECK, {"not_enough_memory": 1}),  # cut inside the check (vllm#20726)
    (['  File "/x/vllm/v1/core/kv_cache_utils.py", line 758, in _check_enough_kv_cache_memory'],
     {"not_enough_memory": 1}),  # the check's own frame the last line
    (KV_CHECK + ['  File "/x/vllm/v1/core/kv_cache_utils.py", line 700, in other', "    x = y"], {}),  # went on
    (KV_CHECK + ["ValueError: something else"], {}),  # an error line says what it raised
    (FRAMES, {}),  # frames elsewhere: nothing, as any tail without its error line
])
def test_a_traceback_cut_inside_vllms_kv_memory_check_is_not_enough_memory(tail: list[str], kinds: dict) -> None:
    assert _kinds([VLLM + line for line in [*FRAMES[:2], *tail]]) == kinds


def test_a_cut_kv_check_advises_kv_memory_with_a_shorter_context_as_the_other_way() -> None:
    d = analyze(lines=[VLLM + line for line in [*FRAMES[:2], *KV_CHECK]])
    flag, suggested = _flags(d)["oom.startup"]
    assert flag == "--gpu-memory-utilization" and "--max-model-len lower" in suggested
    assert "cut inside vLLM's KV cache memory check" in next(f.message for f in d.findings if f.id == "oom.startup")


@pytest.mark.parametrize("cut,want", [
    (len(REFUSAL), ("--max-model-len", "99744")),  # the sizes: vLLM's estimate (kv_fit)
    (REFUSAL.index(" (4.26 GiB") + 10, ("--max-model-len", "lower")),  # cut before them: the direction only
])
def test_a_max_seq_len_refusal_cut_before_its_sizes_still_lowers_the_max_model_len(cut: int, want) -> None:
    d = analyze(lines=[VLLM + REFUSAL[:cut]])
    flag, suggested = _flags(d)["oom.startup"]
    assert (flag, suggested.split(" (or")[0]) == want and "--gpu-memory-utilization" in suggested


def test_the_corpus_cut_refusal_and_cut_check_get_both_flags() -> None:
    for name in ("downstream/b70-cookbook-4-v1-xpu-kv-10mib-short", "vllm/vllm-20726-5060ti-check-kv-memory"):
        flag, suggested = _flags(analyze([REAL / f"{name}.log"]))["oom.startup"]
        assert {flag, *[w for w in suggested.split() if w.startswith("--")]} == {"--max-model-len",
                                                                                 "--gpu-memory-utilization"}, name


# -- an engine taking back the memory it released for a trainer ---------------------------------------------------

WAKE_UP = ['  File "/x/vllm/worker/worker.py", line 140, in wake_up', "    allocator.wake_up()",
           '  File "/x/vllm/device_allocator/cumem.py", line 75, in create_and_map',
           "    python_create_and_map(*allocation_handle)",
           "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62"]


@pytest.mark.parametrize("lines,woke", [
    (WAKE_UP, True),  # vllm#13941: sleep mode's wake-up
    (["(SGLangHttpServer pid=1) [torch_memory_saver.cpp] CUresult error: 2 (out of memory)  file=csrc/utils.h"],
     True),  # sglang#14092: the memory saver's resume
    (WAKE_UP[2:], True),  # the allocator alone: only sleep mode allocates with it
    ([OOM_LINE], False),
])
def test_an_oom_in_the_sleep_mode_allocator_says_another_process_holds_memory(lines: list[str], woke: bool) -> None:
    d = analyze(lines=lines)
    f = next(f for f in d.findings if f.id == "oom.other")
    assert ("the other process on the GPU" in f.message) == woke
    assert f.change is not None and f.change.idea == "kv_memory"


# -- an engine in an RL trainer's processes ---------------------------------------------------------------------

STARTUP = ["[2025-05-23 18:02:30] Load weight begin. avail mem=89.40 GB",
           "[2025-05-23 18:02:32] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=86.57 GB, "
           "mem usage=1.03 GB.",
           "[2025-05-23 18:02:32] KV Cache is allocated. #tokens: 4502600, K size: 25.76 GB, V size: 25.76 GB",
           "[2025-05-23 18:02:32] Memory pool end. avail mem=34.40 GB",
           "[2025-05-23 18:02:33] Capture cuda graph begin. This can take up to several minutes. avail mem=34.40 GB",
           "[2025-05-23 18:02:40] Capture cuda graph end. Time elapsed: 7.00 s. mem usage=0.60 GB. avail mem=33.80 GB."]
DECODE = ("[2025-05-23 18:03:00] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, gen throughput "
          "(token/s): 50.00, #queue-req: 0")


@pytest.mark.parametrize("actor,colocated", [
    ("(WorkerDict pid=859183) ", "verl"),  # verl's fused worker (sglang via verl, verl#1611)
    ("(WorkerDict pid=859183, ip=10.0.0.2) ", "verl"),
    ("(SGLangEngine pid=4242) ", None),  # an engine's own actor: a serving deployment under Ray
    ("", None),
])
def test_an_engine_in_verls_workers_leaves_its_free_memory_to_the_trainer(actor: str, colocated) -> None:
    """34 GB free after start-up is memory the KV pool could hold, unless the trainer on the same GPUs uses it."""
    d = analyze(lines=[actor + line for line in STARTUP])
    assert d.timeline.config.colocated_with == colocated
    assert ("gpu_memory.too_much" in _flags(d)) == (colocated is None)
    assert any("verl's trainer processes" in why for _, why in d.unjudged) == (colocated is not None)


def test_only_start_up_lines_say_the_engine_is_colocated() -> None:
    """Batch lines may be read by the fast path, which keeps no prefix: both paths read the same start-up lines."""
    d = analyze(lines=STARTUP + ["(WorkerDict pid=1) " + DECODE])
    assert d.timeline.config.colocated_with is None and "gpu_memory.too_much" in _flags(d)


def test_the_corpus_verl_start_up_is_quiet() -> None:
    d = analyze([REAL / "downstream" / "verl-1611-sglang-async-rollout-startup.log"])
    assert d.timeline.config.colocated_with == "verl"
    assert not [f for f in d.findings if f.severity in ("warning", "critical")]
