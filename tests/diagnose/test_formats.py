"""Every log form of docs/log-formats.md, one sample line each (2025-26 SGLang and vLLM V0/V1): read as the
right event with the right fields; and lines that merely quote a message are not that event. `pytest -v` on
this file is the formats x read table."""
from __future__ import annotations

import pytest

from toolkit.diagnose.read.lines import ParseStats, parse_lines

SG = "[2026-01-10 10:00:00 TP0] "
VL = "(APIServer pid=20584) INFO 11-21 23:10:29 [loggers.py:335] "
CORE = "(EngineCore_DP0 pid=20600) INFO 11-21 23:09:50 "

# (id, lines, kind, expected fields (a subset), expected rank)
FORMATS = [
    # -- SGLang decode line, 2025-26 fields (§2)
    ("sglang decode #full token / swa token usage", SG + "Decode batch, #running-req: 12, #full token: 9000, "
     "full token usage: 0.30, #swa token: 5000, swa token usage: 0.61, cuda graph: True, "
     "gen throughput (token/s): 812.55, #queue-req: 0", "decode",
     {"token": 9000, "token_usage": 0.61, "swa_token": 5000, "running_req": 12, "gen_throughput": 812.55}, "TP0"),
    ("sglang decode mamba num / mamba usage", SG + "Decode batch, #running-req: 3, #token: 200, token usage: 0.10, "
     "mamba num: 3, mamba usage: 0.45, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 1", "decode",
     {"token_usage": 0.45, "mamba_num": 3, "mamba_usage": 0.45}, "TP0"),
    ("sglang decode HiSparse #gpu token / #cpu token", SG + "Decode batch, #running-req: 4, #gpu token: 100, "
     "gpu token usage: 0.20, #cpu token: 900, cpu token usage: 0.70, cuda graph: True, "
     "gen throughput (token/s): 10.00, #queue-req: 0", "decode",
     {"token": 100, "token_usage": 0.2, "cpu_token": 900, "cpu_token_usage": 0.7}, "TP0"),
    ("sglang decode accept len / accept rate", SG + "Decode batch, #running-req: 8, #token: 800, token usage: 0.01, "
     "accept len: 3.12, accept rate: 0.78, cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0",
     "decode", {"accept_len": 3.12, "accept_rate": 0.78}, "TP0"),
    ("sglang decode PD pre-allocated usage / #prealloc-req / #transfer-req / #retracted-req", SG + "Decode batch. "
     "#running-req: 18, #token: 16384, token usage: 0.71, pre-allocated usage: 0.28, #prealloc-req: 5, "
     "#transfer-req: 3, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 2520.18, #queue-req: 3",
     "decode", {"pre_allocated_usage": 0.28, "prealloc_req": 5, "transfer_req": 3, "retracted_req": 0}, "TP0"),
    ("sglang decode cpu graph", SG + "Decode batch, #running-req: 1, #token: 9, token usage: 0.00, cpu graph: False, "
     "gen throughput (token/s): 8.50, #queue-req: 0", "decode", {"cuda_graph": False}, "TP0"),
    ("sglang decode npu graph", SG + "Decode batch, #running-req: 1, #token: 9, token usage: 0.00, npu graph: True, "
     "gen throughput (token/s): 8.50, #queue-req: 0", "decode", {"cuda_graph": True}, "TP0"),
    ("sglang decode [1234] forward-iteration tag", SG + "Decode batch [51341], #running-req: 3, #token: 9, "
     "token usage: 0.00, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0", "decode",
     {"iter": 51341, "running_req": 3}, "TP0"),
    ("sglang decode MFU / bandwidth suffixes", SG + "Decode batch, #running-req: 3, #token: 9, token usage: 0.00, "
     "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0, est. decode TFLOPS/s (per GPU): 12.34, "
     "est. read BW (GB/s per GPU): 456.78, est. write BW (GB/s per GPU): 1.23", "decode",
     {"est_decode_tflops_s_per_gpu": 12.34, "est_read_bw_gb_s_per_gpu": 456.78, "queue_req": 0}, "TP0"),
    ("sglang decode unknown keys kept", SG + "Decode batch, #running-req: 3, #token: 9, token usage: 0.00, "
     "mystery key: ??, cap len: 7, block accept len: 2.5, #host-receive-req: 1, waiting-image-req: 2, "
     "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0", "decode",
     {"mystery_key": "??", "cap_len": 7, "block_accept_len": 2.5, "host_receive_req": 1, "waiting_image_req": 2},
     "TP0"),
    ("sglang decode ms stamp and TP/EP tags", "[2026-01-10 10:00:00.123 TP0 EP0] Decode batch, #running-req: 3, "
     "#token: 9, token usage: 0.00, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0", "decode",
     {"running_req": 3}, "TP0 EP0"),
    # -- SGLang prefill line (§3)
    ("sglang prefill #pending-token / input throughput", SG + "Prefill batch, #new-seq: 1, #new-token: 64, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 7, cuda graph: True, "
     "input throughput (token/s): 5.25", "prefill", {"pending_token": 7, "input_throughput": 5.25}, "TP0"),
    ("sglang PD prefill #unbootstrapped-req / #transferring-req (0.4.9)", SG + "Prefill batch. #new-seq: 2, "
     "#new-token: 512, #cached-token: 0, token usage: 0.05, #running-req: 0, #unbootstrapped-req: 1, "
     "#queue-req: 4, #transferring-req: 2, input throughput (token/s): 12040.55 ", "prefill",
     {"unbootstrapped_req": 1, "transferring_req": 2, "input_throughput": 12040.55, "queue_req": 4}, "TP0"),
    ("sglang PD prefill #prealloc-req / #inflight-req (0.5.3)", SG + "Prefill batch. #new-seq: 1, #new-token: 64, "
     "#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, #prealloc-req: 2, #inflight-req: 3, ",
     "prefill", {"prealloc_req": 2, "inflight_req": 3}, "TP0"),
    ("sglang PD prefill #bootstrap-req / fwd occupancy / est. prefill TFLOPS (0.5.23)",
     "[2026-07-21 08:04:41 TP0 EP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 10048, "
     "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, #bootstrap-req: 0, #inflight-req: 1, "
     "cuda graph: False, input throughput (token/s): 178.18, est. prefill TFLOPS/s (per GPU): 9.90, "
     "fwd occupancy: nan%", "prefill",
     {"bootstrap_req": 0, "inflight_req": 1, "input_throughput": 178.18, "est_prefill_tflops_s_per_gpu": 9.9},
     "TP0 EP0"),
    # -- SGLang retraction (§6.1)
    ("sglang retraction #new_tokens_gained (0.5.23)", SG + "KV cache pool is full. Retract requests. "
     "#retracted_reqs: 2, #new_tokens_gained: 1024, #new_token_ratio: 0.4000 -> 0.6000", "retract",
     {"retracted_reqs": 2, "new_tokens_gained": 1024, "new_token_ratio": 0.6}, "TP0"),
    ("sglang retraction #mamba_num_gained", SG + "KV cache pool is full. Retract requests. #retracted_reqs: 1, "
     "#new_tokens_gained: 64, #mamba_num_gained: 2, #new_token_ratio: 0.4000 -> 0.6000", "retract",
     {"mamba_num_gained": 2}, "TP0"),
    ("sglang retraction Testing retraction", SG + "Testing retraction. #retracted_reqs: 1, "
     "#new_token_ratio: 0.4000 -> 0.6000", "retract", {"retracted_reqs": 1}, "TP0"),
    ("sglang retraction older wording", "[12:00:01 TP3] Decode out of memory happened. #retracted_reqs: 3, "
     "#new_token_ratio: 0.3000 -> 0.8000", "retract", {"retracted_reqs": 3}, "TP3"),
    # -- vLLM stats line (§9.2)
    ("vllm V1 0.32 CPU stats line", VL + "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
     "throughput: 359.8 tokens/s, Running: 32 reqs, Waiting: 0 reqs, CPU KV cache usage: 6.6%, "
     "Prefix cache hit rate: 0.0%", "stats",
     {"running_req": 32, "queue_req": 0, "gen_throughput": 359.8, "input_throughput": 0.0, "token_usage": 0.066,
      "cache_hit_rate": 0.0, "engine": 0}, "DP0"),
    ("vllm V1 Preemptions / Deferred / External / MM cache", VL + "Engine 001: Avg prompt throughput: 1024.5 "
     "tokens/s, Avg generation throughput: 2048.0 tokens/s, Running: 256 reqs, Waiting: 12 reqs, Deferred: 3 reqs, "
     "Preemptions: 4, GPU KV cache usage: 97.5%, Prefix cache hit rate: 45.2%, External prefix cache hit rate: "
     "10.0%, MM cache hit rate: 5.0%", "stats",
     {"preemptions": 4, "deferred_req": 3, "token_usage": 0.975, "external_prefix_cache_hit_rate": 0.1,
      "mm_cache_hit_rate": 0.05, "queue_req": 12}, "DP1"),
    ("vllm V1 N Engines Aggregated", VL + "2 Engines Aggregated: Avg prompt throughput: 10.0 tokens/s, "
     "Avg generation throughput: 20.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
     "Prefix cache hit rate: 0.0%", "stats", {"engines": 2, "running_req": 8}, "DP*"),
    # -- a markdown code fence the paste glued to a line (syv-ai/qwen38-27b-rtx3090#68; held-out batch 17)
    ("issue paste: a code fence glued before a vLLM stats line", "```" + VL + "Engine 000: Avg prompt throughput: "
     "0.0 tokens/s, Avg generation throughput: 50.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: "
     "53.7%, Prefix cache hit rate: 83.1%", "stats", {"running_req": 1, "token_usage": 0.537}, "DP0"),
    ("issue paste: a code fence glued after an SGLang decode line", SG + "Decode batch, #running-req: 3, #token: 200, "
     "token usage: 0.10, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 1```", "decode",
     {"running_req": 3, "queue_req": 1}, "TP0"),
    ("vllm V1 0.8 (no process prefix)", "INFO 04-10 12:00:00 [loggers.py:111] Engine 000: Avg prompt throughput: "
     "5.0 tokens/s, Avg generation throughput: 12.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache "
     "usage: 2.1%, Prefix cache hit rate: 0.0%", "stats", {"token_usage": 0.021}, "DP0"),
    ("vllm V1 0.7 (no engine, no KV usage)", "INFO 03-05 10:00:00 [loggers.py:78] Avg prompt throughput: 0.0 "
     "tokens/s, Avg generation throughput: 12.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs ", "stats",
     {"gen_throughput": 12.3, "queue_req": 0}, ""),
    ("vllm V0 Swapped / Pending / GPU+CPU KV cache usage", "INFO 05-20 10:00:00 metrics.py:351] Avg prompt "
     "throughput: 0.0 tokens/s, Avg generation throughput: 82.2 tokens/s, Running: 4 reqs, Swapped: 0 reqs, "
     "Pending: 2 reqs, GPU KV cache usage: 3.5%, CPU KV cache usage: 0.0%.", "stats",
     {"queue_req": 2, "swapped_req": 0, "token_usage": 0.035, "cpu_kv_cache_usage": 0.0}, ""),
    ("vllm V0 prefix cache hit rate line", "INFO 05-20 10:00:00 metrics.py:367] Prefix cache hit rate: "
     "GPU: 45.67%, CPU: 0.00%", "prefix_cache", {"cache_hit_rate": 0.4567}, ""),
    # -- vLLM start-up (§9.3)
    ("vllm KV cache size + max concurrency (one line)", CORE + "[kv_cache_utils.py:1234] GPU KV cache size: "
     "447,088 tokens, Maximum concurrency for 32,768 tokens per request: 13.64x", "kv_capacity",
     {"kv_tokens": 447088, "max_model_len": 32768, "max_concurrency": 13.64, "device": "gpu"}, "DP0"),
    ("vllm CPU KV cache size", CORE + "[kv_cache_utils.py:1234] CPU KV cache size: 186,368 tokens", "kv_capacity",
     {"kv_tokens": 186368, "device": "cpu"}, "DP0"),
    ("vllm Maximum concurrency (own line)", "INFO 03-14 09:13:08 [kv_cache_utils.py:570] Maximum concurrency for "
     "32,768 tokens per request: 13.64x", "max_concurrency", {"max_model_len": 32768, "max_concurrency": 13.64}, ""),
    ("vllm V0 # GPU blocks", "INFO 12-22 10:55:35 gpu_executor.py:76] # GPU blocks: 715, # CPU blocks: 1310",
     "gpu_blocks", {"device_blocks": 715, "cpu_blocks": 1310}, ""),
    ("vllm # cuda blocks", "INFO 08-12 22:32:11 [executor_base.py:113] # cuda blocks: 190100, # CPU blocks: 0",
     "gpu_blocks", {"device_blocks": 190100, "device": "cuda"}, ""),
    ("vllm memory profiling (total_gpu_memory x utilization)", "INFO 08-12 22:32:11 [worker.py:295] the current "
     "vLLM instance can use total_gpu_memory (47.50GiB) x gpu_memory_utilization (0.78) = 37.18GiB",
     "memory_profile", {"total_gpu_memory_gb": 47.5, "gpu_memory_utilization": 0.78}, ""),
    ("vllm memory profiling (weights / KV cache)", "INFO 08-12 22:32:11 [worker.py:295] model weights take 0.52GiB; "
     "non_torch_memory takes 0.08GiB; PyTorch activation peak memory takes 1.78GiB; the rest of the memory "
     "reserved for KV Cache is 34.81GiB.", "memory_profile", {"weights_gb": 0.52, "kv_cache_gb": 34.81}, ""),
    ("vllm Available KV cache memory", CORE + "[gpu_worker.py:760] Available KV cache memory: 54.62 GiB",
     "kv_memory", {"kv_cache_gb": 54.62}, "DP0"),
    ("vllm Model loading took", CORE + "[gpu_model_runner.py:5150] Model loading took 14.9888 GiB and 13.204526 "
     "seconds", "weights_loaded", {"weights_gb": 14.9888, "load_seconds": 13.204526}, "DP0"),
    ("vllm V0 Loading model weights took", "INFO 12-22 10:55:34 model_runner.py:1097] Loading model weights took "
     "8.5107 GB", "weights_loaded", {"weights_gb": 8.5107}, ""),
    ("vllm graph capture", CORE + "[gpu_model_runner.py:6582] Graph capturing finished in 13 secs, took 0.33 GiB",
     "graph_captured", {"elapsed": 13.0, "graph_gb": 0.33}, "DP0"),
    ("vllm engine config", CORE + "[core.py:134] Initializing a V1 LLM engine (v0.11.0) with config: "
     "model='Qwen/Qwen3-8B', speculative_config=None, dtype=torch.bfloat16, max_seq_len=32768, "
     "tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1, quantization=None, "
     "enforce_eager=False, kv_cache_dtype=auto, enable_prefix_caching=True, compilation_config={'level': 3, "
     "'cudagraph_capture_sizes': [512, 256, 8, 1], 'max_cudagraph_capture_size': 512}", "engine_config",
     {"version": "0.11.0", "model": "Qwen/Qwen3-8B", "max_seq_len": 32768, "tensor_parallel_size": 2,
      "enforce_eager": False, "max_cudagraph_capture_size": 512}, "DP0"),
    ("vllm non-default args", VL + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_num_seqs': 64, "
     "'gpu_memory_utilization': 0.85}", "engine_args",
     {"model": "Qwen/Qwen3-8B", "max_num_seqs": 64, "gpu_memory_utilization": 0.85}, ""),
    ("vllm chunked prefill budget", VL + "Chunked prefill is enabled with max_num_batched_tokens=2048.",
     "scheduler_config", {"max_num_batched_tokens": 2048}, ""),
    # -- vLLM preemption, spec decoding, access (§9.4)
    ("vllm V0 preemption warning", "WARNING 11-27 02:04:48 scheduler.py:1481] Sequence group cmpl-f5a9-0 is "
     "preempted by PreemptionMode.SWAP mode because there is not enough KV cache space. This can affect the "
     "end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache "
     "memory. total_num_cumulative_preemption=1", "preempt", {"mode": "swap", "cumulative_preemptions": 1}, ""),
    ("vllm V1 SpecDecoding metrics", VL + "SpecDecoding metrics: Mean acceptance length: 2.51, Accepted "
     "throughput: 120.30 tokens/s, Drafted throughput: 240.10 tokens/s, Accepted: 1203 tokens, Drafted: 2401 "
     "tokens, Per-position acceptance rate: 0.800, 0.600, 0.400, Avg Draft acceptance rate: 50.1%",
     "spec_metrics", {"accept_len": 2.51, "accept_rate": 0.501}, ""),
    ("vllm V0 Speculative metrics", "INFO 05-20 10:00:00 metrics.py:377] Speculative metrics: Draft acceptance "
     "rate: 0.612, System efficiency: 0.350, Number of speculative tokens: 4, Number of accepted tokens: 2450",
     "spec_metrics", {"accept_rate": 0.612, "number_of_speculative_tokens": 4}, ""),
    ("vllm access line", '(APIServer pid=20584) INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK',
     "access", {"method": "POST", "path": "/v1/completions", "status": 200}, ""),
    ("vllm Ray worker prefix", "(RayWorkerWrapper pid=3918397, ip=10.0.0.2) INFO 03-29 01:24:36 worker.py:272] "
     "model weights take 15.63GiB; non_torch_memory takes 0.81GiB; PyTorch activation peak memory takes 3.52GiB; "
     "the rest of the memory reserved for KV Cache is 11.57GiB.", "memory_profile", {"kv_cache_gb": 11.57}, ""),
]


@pytest.mark.parametrize("name,line,kind,fields,rank", FORMATS, ids=[f[0] for f in FORMATS])
def test_format_is_read(name: str, line: str, kind: str, fields: dict, rank: str) -> None:
    stats = ParseStats()
    events = list(parse_lines([line], stats=stats))
    assert [e.kind for e in events] == [kind], events
    got = events[0].fields
    for key, value in fields.items():
        assert got.get(key) == pytest.approx(value) if isinstance(value, float) else got.get(key) == value, key
    assert events[0].rank == rank and stats.unread == 0


VLLM_ERRORS = [
    ("vllm CUDA out of memory traceback", [
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] EngineCore encountered a fatal error.",
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708]   File "core.py", line 699, in run',
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free."],
     ["exception", "oom"]),
    ("vllm max seq len does not fit", [
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] EngineCore failed to start.",
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=1) ERROR 11-21 23:10:29 [core.py:708] ValueError: To serve at least one request with "
        "the model's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV "
        "cache memory (9.45 GiB). Based on the available memory, the estimated maximum model length is 77392. Try "
        "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."],
     ["exception", "not_enough_memory"]),
    ("vllm no memory for cache blocks", [
        "ERROR 12-22 10:55:35 engine.py:366] No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine."], ["not_enough_memory"]),
    # an engine taking back what it released for a trainer (held-out batch 18): vLLM sleep mode's cumem allocator
    # (vllm#13941), SGLang's torch_memory_saver under verl (sglang#14092, its Ray prefix and de-duplication note)
    ("vllm wake-up OOM, a traceback tail", [
        '  File "/x/vllm/device_allocator/cumem.py", line 75, in create_and_map',
        "    python_create_and_map(*allocation_handle)",
        "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62"], ["oom"]),
    ("sglang memory saver resume OOM", [
        "(SGLangHttpServer pid=250977) [torch_memory_saver.cpp] CUresult error: 2 (out of memory)  file=csrc/utils.h "
        "func=cu_mem_create line=194 [repeated 7x across cluster]"], ["oom"]),
    ("another CUresult error is no OOM", [
        "(SGLangHttpServer pid=250977) [torch_memory_saver.cpp] CUresult error: 1 (invalid argument)  "
        "file=csrc/utils.h func=cu_mem_create line=194"], []),
    ("vllm V1 memory profile as one multi-line message", [
        "INFO 03-14 09:13:07 [gpu_worker.py:227] Memory profiling takes 11.85 seconds",
        "the current vLLM instance can use total_gpu_memory (79.11GiB) x gpu_memory_utilization (0.90) = 71.20GiB",
        "model weights take 14.99GiB; non_torch_memory takes 0.35GiB; PyTorch activation peak memory takes 1.24GiB;",
        "the rest of the memory reserved for KV Cache is 54.62GiB.",
        "INFO 03-14 09:13:08 [kv_cache_utils.py:566] GPU KV cache size: 447,088 tokens"],
     ["memory_profile", "kv_capacity"]),
]


@pytest.mark.parametrize("name,lines,kinds", VLLM_ERRORS, ids=[f[0] for f in VLLM_ERRORS])
def test_multi_line_vllm_records_are_read(name: str, lines: list[str], kinds: list[str]) -> None:
    events = list(parse_lines(lines))
    assert [e.kind for e in events] == kinds
    if name.startswith("vllm V1 memory"):
        assert events[0].fields["kv_cache_gb"] == 54.62 and events[0].fields["total_gpu_memory_gb"] == 79.11


QUOTES = [
    ("a traceback's source line", '  File "/x/scheduler.py", line 10, in f: raise RuntimeError("KV cache pool is '
     'full. Retract requests. #retracted_reqs: 1")'),
    ("a request body in another message", '[2025-11-11 04:06:27] Received request: {"prompt": "Decode out of memory '
     'happened. #retracted_reqs: 1, #new_token_ratio: 0.1 -> 0.2"}'),
    ("an issue title", "Bug: KV cache pool is full. Retract requests. appears on every request"),
    ("a quoted log line", 'user wrote: "[2025-11-11 04:06:27 TP0] KV cache pool is full. Retract requests. '
     '#retracted_reqs: 1"'),
    ("a comment quoting a decode line", "# see Decode batch. #running-req: 1, #token: 2"),
    ("a vLLM line quoting a preemption", VL + "Got request: Sequence group 0 is preempted by "
     "PreemptionMode.RECOMPUTE mode"),
]


@pytest.mark.parametrize("name,line", QUOTES, ids=[q[0] for q in QUOTES])
def test_a_line_that_quotes_a_message_is_not_that_event(name: str, line: str) -> None:
    stats = ParseStats()
    assert list(parse_lines([line], stats=stats)) == []
    assert stats.other == 1
