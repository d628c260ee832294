"""Decode CUDA graph logic that needs no GPU: which sizes are captured, which size a batch pads to, what the
padding writes, the reserved dummy table row, the backends' graph metadata, and the whole capture/replay path on
CPU with a stand-in for the graph (tests/runtime/capture_guard.py) that re-runs the captured forward over the
persistent buffers under what capture forbids: no host sync, no per-batch host value, the captured ops only."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from toolkit.runtime.attention.flashinfer_backend import FlashInferBackend
from toolkit.runtime.attention.torch_native import TorchNativeBackend
from toolkit.runtime.attention.triton_backend import TritonBackend
from toolkit.runtime.cuda_graph_runner import (
    CudaGraphRunner,
    GraphInputs,
    capture_batch_sizes,
    default_capture_batch_sizes,
    padded_batch_size,
)
from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.memory.kv_pool import KVPool
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.model_runner import ModelRunner, cuda_graph_disabled_reason
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.attention import fake_flashinfer
from tests.runtime.attention.cases import Request, make_case
from tests.runtime.capture_guard import GuardedCapture
from tests.runtime.driver import KVDriver

SGLANG_TO_256 = [1, 2, 4, 8, 12, *range(16, 257, 8)]


# ---- which sizes are captured ----
@pytest.mark.parametrize("max_bs, expected", [
    (1, [1]),
    (8, [1, 2, 4, 8]),
    (24, [1, 2, 4, 8, 12, 16, 24]),
    (100, [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96]),
    (256, SGLANG_TO_256),
    (300, [*SGLANG_TO_256, 272, 288]),
    (600, [*SGLANG_TO_256, *range(272, 512, 16), 512, 544, 576]),
])
def test_default_sizes_follow_sglang(max_bs, expected):
    assert default_capture_batch_sizes(max_bs) == expected


def test_default_list_lengths_match_sglang_counts():
    counts = {bs: len(default_capture_batch_sizes(bs)) for bs in (8, 24, 32, 80, 160, 256, 512)}
    assert counts == {8: 4, 24: 7, 32: 8, 80: 14, 160: 24, 256: 36, 512: 52}


@pytest.mark.parametrize("explicit, max_bs, pool, expected", [
    (None, 256, 4097, SGLANG_TO_256),
    (None, 160, 65, [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 65]),  # pool caps, and its size is captured
    (None, 8, 5, [1, 2, 4, 5]),
    ([8, 3, 1, 3], 256, 100, [1, 3, 8]),  # --cuda-graph-bs: sorted, deduplicated; max_bs is ignored
    ([1, 300], 256, 257, [1, 257]),
    ([64], 8, 4096, [64]),
])
def test_capture_sizes_from_flags_and_pool(explicit, max_bs, pool, expected):
    assert capture_batch_sizes(explicit, max_bs, pool) == expected


@pytest.mark.parametrize("num_reqs, padded", [
    (1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 12), (13, 16), (17, 24), (24, 24), (25, None), (400, None),
])
def test_a_batch_pads_to_the_next_captured_size(num_reqs, padded):
    assert padded_batch_size([1, 2, 4, 8, 12, 16, 24], num_reqs) == padded


# ---- what the padding writes ----
def _decode_batch(rows: list[int], seq_lens: list[int], tokens: list[int], slots: list[int]) -> ForwardBatch:
    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    return ForwardBatch(
        ForwardMode.DECODE, t(tokens), t([n - 1 for n in seq_lens]), t(slots), t(rows), rows, t(seq_lens), seq_lens,
        [n - 1 for n in seq_lens], [1] * len(rows), torch.zeros(1, 1, dtype=torch.int32), None, None,
    )


def test_padding_rows_are_dummy_requests_in_the_padding_slot():
    inputs = GraphInputs.allocate(8, torch.device("cpu"), dummy_row=9, seq_len_fill_value=1)
    inputs.load(_decode_batch([3, 0, 5], [17, 4, 30], [101, 102, 103], [40, 41, 42]), bs=4)
    assert inputs.input_ids.tolist() == [101, 102, 103, 0, 0, 0, 0, 0]
    assert inputs.positions.tolist() == [16, 3, 29, 0, 0, 0, 0, 0]
    assert inputs.out_cache_loc.tolist() == [40, 41, 42, 0, 0, 0, 0, 0]
    assert inputs.req_pool_indices.tolist() == [3, 0, 5, 9, 9, 9, 9, 9]
    assert inputs.seq_lens.tolist() == [17, 4, 30, 1, 1, 1, 1, 1]
    # a smaller batch later: stale real rows inside the padded size become dummies again
    inputs.load(_decode_batch([7, 2, 6, 1, 4], [9, 9, 9, 9, 9], [5] * 5, [60, 61, 62, 63, 64]), bs=8)
    inputs.load(_decode_batch([2], [50], [77], [70]), bs=2)
    assert inputs.input_ids.tolist() == [77, 0, 5, 5, 5, 0, 0, 0]
    assert inputs.out_cache_loc.tolist() == [70, 0, 62, 63, 64, 0, 0, 0]
    assert inputs.req_pool_indices.tolist() == [2, 9, 6, 1, 4, 9, 9, 9]
    assert inputs.seq_lens.tolist() == [50, 1, 9, 9, 9, 1, 1, 1]


def test_dummy_row_is_never_handed_out_and_stays_zero():
    pool = ReqToTokenPool(4, 16, "cpu")
    rows = [pool.alloc() for _ in range(4)]
    assert rows == [0, 1, 2, 3] and pool.alloc() is None
    assert pool.dummy_row == 4 and tuple(pool.req_to_token.shape) == (5, 16)
    for row in rows:
        pool.write(row, 0, torch.arange(5, 21))
        pool.free(row)
    assert pool.available_size() == pool.size == 4
    assert sorted(pool.alloc() for _ in range(4)) == [0, 1, 2, 3]
    assert pool.req_to_token[pool.dummy_row].count_nonzero() == 0


# ---- when graphs are captured ----
class _Backend:
    def __init__(self, name: str, graphs: bool) -> None:
        self.name, self.supports_cuda_graph = name, graphs


@pytest.mark.parametrize("device, disable, backend, reason", [
    ("cpu", False, _Backend("triton", True), "the device is cpu"),
    ("cpu", False, _Backend("torch_native", True), "the device is cpu"),
    ("cuda", True, _Backend("triton", True), "--disable-cuda-graph is set"),
    ("cuda", False, _Backend("torch_native", False), "--attention-backend torch_native does not support it"),
    ("cuda", False, _Backend("triton", True), None),
    ("cuda", False, _Backend("flashinfer", True), None),
])
def test_graphs_only_on_cuda_with_a_graph_backend(device, disable, backend, reason):
    args = ServerArgs(disable_cuda_graph=disable)
    assert cuda_graph_disabled_reason(torch.device(device), args, backend) == reason


def test_cpu_compile_needs_a_replayable_decode_step():
    """On a CPU, --enable-torch-compile compiles the padded decode step per size: the backend must read its
    metadata from the step's persistent tensors (torch_native's in-place kernel does; its gather path does not)."""
    args = ServerArgs(enable_torch_compile=True)
    assert cuda_graph_disabled_reason(torch.device("cpu"), args, TorchNativeBackend("cpu")) is None
    reason = cuda_graph_disabled_reason(torch.device("cpu"), args, TorchNativeBackend("cpu", in_place_decode=False))
    assert reason == "--attention-backend torch_native on this CPU cannot run a compiled decode step"


def test_backends_declare_graph_support():
    assert not TorchNativeBackend("cuda").supports_cuda_graph and TorchNativeBackend("cpu").supports_cuda_graph
    assert TritonBackend.supports_cuda_graph and FlashInferBackend.supports_cuda_graph


# ---- triton: fixed grid per captured size, eager's splits per request ----
def _table_batch(backend, rows: list[int], seq_lens: list[int], table, pool) -> ForwardBatch:
    zeros = torch.zeros(len(rows), dtype=torch.int64)
    return ForwardBatch(
        ForwardMode.DECODE, zeros, zeros, zeros, torch.tensor(rows), rows, torch.tensor(seq_lens), seq_lens,
        [n - 1 for n in seq_lens], [1] * len(rows), table, pool, backend,
    )


def test_triton_graph_split_grid_per_size_and_eager_splits_per_request():
    backend = TritonBackend(torch.device("cpu"))
    backend.target_programs = 4 * 132  # an H100's SMs
    sizes, context = [1, 8, 12, 64, 72, 80], 40_000
    backend.init_cuda_graph_state(sizes, context)
    pool = KVPool(64, 1, 1, 8, 16, torch.float32, "cpu")
    table = torch.zeros(81, context, dtype=torch.int32)
    capacity = {}
    for bs in sizes:
        batch = _table_batch(backend, [80] * bs, [1] * bs, table, pool)
        backend.init_forward_metadata_capture_cuda_graph(batch)
        capacity[bs] = batch.attn_metadata.max_kv_splits
    # the smallest real batch per size is 1, 2, 9, 13, 65, 73: min(32, ceil(528 programs / (n · 8 KV heads)))
    assert capacity == {1: 32, 8: 32, 12: 8, 64: 6, 72: 2, 80: 1}
    real_lens = [5000, 300, 9000, 256, 257, 1, 20000, 700, 4000]  # 9 real requests padded to 12
    batch = _table_batch(backend, list(range(9)) + [80] * 3, real_lens + [1, 1, 1], table, pool)
    backend.init_forward_metadata_replay_cuda_graph(batch, num_real=9)
    eager = _table_batch(backend, list(range(9)), real_lens, table, pool)
    backend.init_forward_metadata(eager)
    graph_splits = backend.graph_buffers.num_kv_splits[:12].tolist()
    assert graph_splits[:9] == eager.attn_metadata.num_kv_splits.tolist() == [8, 2, 8, 1, 2, 1, 8, 3, 8]
    assert graph_splits[9:] == [1, 1, 1]
    total = sum(real_lens)
    assert backend.graph_buffers.kv_indptr[9:13].tolist() == [total, total + 1, total + 2, total + 3]


# ---- flashinfer: one graph-mode wrapper per size, re-planned before each replay ----
def _padded(case, backend, pad: int) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The case's decode batch plus `pad` dummy requests on table row 0 (all zeros in cases) at slot 0."""
    rows = case.rows + [0] * pad
    seq_lens = [p + 1 for p in case.prefix_lens] + [1] * pad
    slots = torch.cat([case.out_cache_loc, torch.zeros(pad, dtype=torch.int64)])
    zeros = torch.zeros(len(rows), dtype=torch.int64)
    batch = ForwardBatch(
        ForwardMode.DECODE, zeros, zeros, slots, torch.tensor(rows), rows, torch.tensor(seq_lens), seq_lens,
        [n - 1 for n in seq_lens], [1] * len(rows), case.req_to_token, case.pool, backend,
    )
    q, k, v = (torch.cat([x, torch.zeros_like(x[:1]).expand(pad, -1, -1)]) for x in (case.q, case.k, case.v))
    return batch, q, k, v


def test_flashinfer_graph_wrapper_is_replanned_before_replay(monkeypatch):
    from toolkit.runtime.attention import flashinfer_backend

    module = fake_flashinfer.install(monkeypatch)
    monkeypatch.setattr(flashinfer_backend, "check_flashinfer_usable", lambda device: None)
    backend = FlashInferBackend(torch.device("cpu"))
    backend.init_cuda_graph_state([4], 64)
    cases = [make_case([Request(n, 1) for n in lens], 1, 8, 2, 64, torch.bfloat16, decode=True, seed=seed)
             for seed, lens in ((1, [3, 30, 12]), (2, [40, 2, 9]))]
    captured, q, k, v = _padded(cases[0], backend, 1)
    backend.init_forward_metadata_capture_cuda_graph(captured)
    outputs = [backend.forward_decode(q, k, v, cases[0].layer, captured)]  # plans at first use, eagerly
    plans = module.BatchDecodeWithPagedKVCacheWrapper.plans
    replayed, q, k, v = _padded(cases[1], backend, 1)
    backend.init_forward_metadata_replay_cuda_graph(replayed, num_real=3)
    assert module.BatchDecodeWithPagedKVCacheWrapper.plans == plans + 1
    replayed.attn_metadata = captured.attn_metadata  # a replay runs the captured kernels: no plan in between
    outputs.append(backend.forward_decode(q, k, v, cases[1].layer, replayed))
    assert module.BatchDecodeWithPagedKVCacheWrapper.plans == plans + 1
    for case, out in zip(cases, outputs):
        reference, _ = case.reference()
        assert (out[:3].float() - reference).abs().max().item() < 2e-2
    plan = backend.graph_buffers.wrappers[4].plan_args
    assert plan["indptr"].tolist() == [0, 41, 44, 54, 55]
    assert plan["indices"][-1].item() == 0  # the dummy request reads the padding slot


# ---- the whole path on CPU: capture, pad, replay, eager above the largest size (capture's rules enforced) ----
# NOTE: one layer and few heads keep the Triton interpreter (a Python loop over programs) fast.
TINY_LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 320}


def _runner(overrides: dict = TINY_LLAMA, **kwargs) -> ModelRunner:
    """A one-layer Llama-3.1 with random (dummy) weights: no checkpoint, no tokenizer."""
    settings = dict(context_length=256, dtype="float32", device="cpu", max_total_tokens=1024, max_running_requests=8,
                    random_seed=5)
    settings.update(kwargs)
    args = ServerArgs(model_path="llama-3.1-8b", load_format="dummy", json_model_override_args=json.dumps(overrides),
                      **settings)
    return ModelRunner(args)


def test_cpu_captures_nothing_and_reports_no_graph(caplog):
    with caplog.at_level(logging.INFO, logger="runtime"):
        runner = _runner()
    assert runner.graph_runner is None
    assert "Capture" not in caplog.text
    driver = KVDriver(runner)
    seqs = [driver.new_sequence() for _ in range(2)]
    driver.extend(seqs, [[5, 6, 7], [8, 9]])
    driver.decode(seqs, [10, 11])
    assert driver.used_cuda_graph is False


def test_graph_replay_matches_eager_and_pads_into_the_reserved_slot(caplog):
    runner = _runner(attention_backend="triton", disable_cuda_graph=True)
    with caplog.at_level(logging.INFO, logger="runtime"):
        graphs = CudaGraphRunner(runner.model, runner.attn_backend, runner.kv_pool, runner.req_to_token_pool,
                                 runner.device, [1, 2, 4], capture=GuardedCapture)
        graphs.WARMUP_RUNS = 0  # they only compile kernels before a real capture
        graphs.capture()
    assert sorted(graphs.graphs) == [1, 2, 4]
    assert "Capture cuda graph begin. This can take up to several minutes. avail mem=" in caplog.text
    assert "Capture cuda graph end. Time elapsed: " in caplog.text and " s. mem usage=" in caplog.text
    runner.graph_runner = graphs
    driver = KVDriver(runner)
    seqs = [driver.new_sequence() for _ in range(5)]
    prompts = [[3, 4, 5, 6], [7] * 9, [11, 12], [13, 14, 15, 16, 17, 18], [19, 20, 21]]
    driver.extend(seqs, prompts)
    assert driver.used_cuda_graph is False  # extend: eager
    runner.kv_pool.k_buffer[0][0].zero_()
    table_row_before = runner.req_to_token_pool.req_to_token[runner.req_to_token_pool.dummy_row].clone()

    graph_logits = driver.decode(seqs[:3], [30, 31, 32])  # 3 real requests padded to 4
    assert driver.used_cuda_graph is True and graphs.graphs[4].replays == 1
    batch = ForwardBatch.build(
        ForwardMode.DECODE, [s.row for s in seqs[:3]], [len(s.tokens) - 1 for s in seqs[:3]], [[30], [31], [32]],
        torch.tensor([int(runner.req_to_token_pool.req_to_token[s.row, len(s.tokens) - 1]) for s in seqs[:3]]),
        runner.req_to_token_pool.req_to_token, runner.kv_pool, runner.attn_backend,
    )
    eager_logits = runner.model(batch)
    assert graph_logits.shape == (3, 320) and graph_logits.data_ptr() == graphs.logits.data_ptr()
    # NOTE: a batch of 4 (padded) and a batch of 3 may take different BLAS kernels on another CPU (AMD EPYC
    # does), so the rows agree to float32 rounding, not bit for bit; the greedy choice must not differ.
    torch.testing.assert_close(graph_logits, eager_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(graph_logits.argmax(-1), eager_logits.argmax(-1))
    assert runner.kv_pool.k_buffer[0][0].count_nonzero() > 0, "the dummy request's K/V land in slot 0"
    assert torch.equal(runner.req_to_token_pool.req_to_token[runner.req_to_token_pool.dummy_row], table_row_before)

    driver.decode(seqs, [40, 41, 42, 43, 44])  # 5 > 4: eager
    assert driver.used_cuda_graph is False and graphs.graphs[4].replays == 1
    driver.decode(seqs[:1], [50])
    assert driver.used_cuda_graph is True and graphs.graphs[1].replays == 1


def _graph_and_eager_decode(runner, graphs, seqs, tokens: list[int], driver) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode step's logits through the graphs, then the same step run eagerly by the model."""
    graph_logits = driver.decode(seqs, tokens).clone()
    assert driver.used_cuda_graph is True
    table = runner.req_to_token_pool.req_to_token
    batch = ForwardBatch.build(
        ForwardMode.DECODE, [s.row for s in seqs], [len(s.tokens) - 1 for s in seqs], [[t] for t in tokens],
        torch.tensor([int(table[s.row, len(s.tokens) - 1]) for s in seqs]), table, runner.kv_pool,
        runner.attn_backend,
    )
    return graph_logits, runner.model(batch)


# NOTE: FlashInfer's kernels take head_dim 64/128/256 in half precision.
TINY_LLAMA_HD64 = {**TINY_LLAMA, "hidden_size": 128, "head_dim": 64}


def test_flashinfer_graphs_plan_outside_the_capture_and_replay_what_they_captured(monkeypatch):
    """The whole decode-graph path with FlashInfer (the strict stand-in): every plan() happens eagerly (the
    stand-in refuses one inside a capture), a replay reads the re-planned persistent buffers (it refuses metadata
    that changed since its plan), and the logits equal the eager step's."""
    from toolkit.runtime.attention import flashinfer_backend

    module = fake_flashinfer.install(monkeypatch)
    monkeypatch.setattr(flashinfer_backend, "check_flashinfer_usable", lambda device: None)
    runner = _runner(TINY_LLAMA_HD64, attention_backend="flashinfer", dtype="bfloat16")
    graphs = CudaGraphRunner(runner.model, runner.attn_backend, runner.kv_pool, runner.req_to_token_pool,
                             runner.device, [1, 2, 4], capture=GuardedCapture)
    graphs.capture()
    assert sorted(graphs.graphs) == [1, 2, 4] and sorted(runner.attn_backend.graph_buffers.wrappers) == [1, 2, 4]
    runner.graph_runner = graphs
    driver = KVDriver(runner)
    seqs = [driver.new_sequence() for _ in range(3)]
    driver.extend(seqs, [[3, 4, 5, 6], [7] * 9, [11, 12]])
    plans = module.BatchDecodeWithPagedKVCacheWrapper.plans
    for step, tokens in enumerate(([30, 31, 32], [33, 34, 35])):  # 3 requests padded to 4, twice
        graph_logits, eager_logits = _graph_and_eager_decode(runner, graphs, seqs, tokens, driver)
        assert graphs.graphs[4].replays == step + 1
        torch.testing.assert_close(graph_logits, eager_logits, rtol=2e-2, atol=2e-2)
        assert torch.equal(graph_logits.argmax(-1), eager_logits.argmax(-1))
    # each replay re-planned the size-4 wrapper once; each eager step planned the eager one once
    assert module.BatchDecodeWithPagedKVCacheWrapper.plans == plans + 4


def test_cpu_torch_compile_keeps_greedy_output_and_pads_like_a_graph(caplog):
    """--enable-torch-compile on a CPU: the decode step compiled per size (static shapes, padded like a graph)
    gives the eager step's logits and greedy choice; larger batches run eagerly; the line says `cpu graph`."""
    with caplog.at_level(logging.INFO, logger="runtime"):
        runner = _runner(enable_torch_compile=True, torch_compile_max_bs=2, cuda_graph_bs=[1, 2])
    assert runner.graph_runner is not None and sorted(runner.graph_runner.graphs) == [1, 2]
    assert "Capture cpu graph begin" in caplog.text and "Capture cpu graph end" in caplog.text
    replays = []
    graph = runner.graph_runner.graphs[1]
    run = graph.run
    graph.run = lambda: (replays.append(1), run())
    eager = _runner()
    outputs = []
    for model_runner in (runner, eager):
        driver = KVDriver(model_runner)
        seqs = [driver.new_sequence() for _ in range(3)]
        driver.extend(seqs, [[3, 4, 5, 6], [7] * 9, [11, 12]])
        logits = [driver.decode(seqs[:1], [30]).clone(), driver.decode(seqs, [31, 32, 33]).clone()]
        outputs.append((logits, driver.used_cuda_graph))
    (compiled, last_used), (reference, _) = outputs
    assert replays == [1], "the one-request decode step replayed the compiled size-1 step"
    assert last_used is False  # a replay on a CPU is a compiled step, not a CUDA graph
    for ours, theirs in zip(compiled, reference):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
