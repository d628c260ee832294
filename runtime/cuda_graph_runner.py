"""Decode CUDA graphs (SGLang's `CudaGraphRunner`): one graph per captured batch size, largest first in one memory
pool, over persistent input buffers. A decode batch runs the graph of the next captured size, padded with dummy
requests that write their K/V to the reserved padding slot 0 and read the reserved dummy table row; larger
batches run eagerly.

With `--enable-torch-compile`, the sizes up to `--torch-compile-max-bs` capture a `torch.compile`d forward. On a
CPU there are no graphs to capture: the same runner compiles the decode forward once per size (static shapes, over
the same persistent buffers and padding) and replays it by calling it (`CompiledReplay`).
"""
from __future__ import annotations

import bisect
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from toolkit.runtime.attention.base import AttentionBackend
from toolkit.runtime.memory.device import available_memory_gib
from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.memory.kv_pool import KVPool
from toolkit.runtime.memory.req_to_token import ReqToTokenPool

logger = logging.getLogger("runtime")

CAPTURE_FAILED_HINT = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph (not recommended: a large decode slowdown)"
)


def default_capture_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's list: 1, 2, 4, 8, 12, then steps of 8 to 256, of 16 to 511, of 32 from 512; up to max_bs."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [bs for bs in sizes if bs <= max_bs]


def capture_batch_sizes(cuda_graph_bs: list[int] | None, cuda_graph_max_bs: int, req_pool_size: int) -> list[int]:
    """The sizes to capture, ascending: `--cuda-graph-bs` or the default list, capped by the request pool (whose
    size is then captured too, so the largest batch that can run still has a graph)."""
    sizes = list(cuda_graph_bs) if cuda_graph_bs else default_capture_batch_sizes(cuda_graph_max_bs)
    if sizes and max(sizes) > req_pool_size:
        sizes.append(req_pool_size)
    sizes = sorted({bs for bs in sizes if 0 < bs <= req_pool_size})
    if not sizes:
        raise ValueError(f"no CUDA graph batch size to capture from {cuda_graph_bs or cuda_graph_max_bs}")
    return sizes


def padded_batch_size(batch_sizes: list[int], num_reqs: int) -> int | None:
    """The smallest captured size that holds `num_reqs` requests; None above the largest (run eagerly)."""
    index = bisect.bisect_left(batch_sizes, num_reqs)
    return batch_sizes[index] if index < len(batch_sizes) else None


@dataclass
class GraphInputs:
    """The persistent decode inputs every graph reads, [max_bs] each; a graph of size bs reads the first bs."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    dummy_row: int
    seq_len_fill_value: int

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device, dummy_row: int, seq_len_fill_value: int) -> GraphInputs:
        def filled(value: int) -> torch.Tensor:
            return torch.full((max_bs,), value, dtype=torch.int64, device=device)

        return cls(filled(0), filled(0), filled(0), filled(dummy_row), filled(seq_len_fill_value), dummy_row,
                   seq_len_fill_value)

    def load(self, batch: ForwardBatch, bs: int) -> None:
        """Copy a real decode batch of n requests into rows [0, n) and make rows [n, bs) dummy requests."""
        n = batch.batch_size
        reals = (batch.input_ids, batch.positions, batch.out_cache_loc, batch.req_pool_indices, batch.seq_lens)
        for buffer, real in zip(self._buffers(), reals):
            buffer[:n].copy_(real)
        if n < bs:
            self.fill_dummy(n, bs)

    def fill_dummy(self, start: int, end: int) -> None:
        """Rows [start, end) become dummy requests: token 0 at position 0, K/V written to the padding slot 0,
        table row `dummy_row`, `seq_len_fill_value` tokens long."""
        pads = (0, 0, 0, self.dummy_row, self.seq_len_fill_value)
        for buffer, pad in zip(self._buffers(), pads):
            buffer[start:end].fill_(pad)

    def _buffers(self) -> tuple[torch.Tensor, ...]:
        return self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices, self.seq_lens


class Replayable(Protocol):
    def replay(self) -> None: ...


# Runs a forward once under capture and returns the graph that replays it.
GraphCapture = Callable[[Callable[[], object]], Replayable]


class CompiledReplay:
    """A CPU "graph": the compiled forward, run once at capture (compiling it for this size) and re-run over the
    same persistent buffers at each replay."""

    def __init__(self, run: Callable[[], object]) -> None:
        self.run = run
        run()

    def replay(self) -> None:
        self.run()


class CudaGraphCapture:
    """Captures every graph into one memory pool on a side stream; sizes captured later reuse that memory."""

    def __init__(self, device: torch.device) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, run: Callable[[], object]) -> Replayable:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            run()
        return graph


class CudaGraphRunner:
    """Captures the decode graphs once (`capture()`), then replays the one a decode batch pads to."""

    WARMUP_RUNS = 2

    def __init__(
        self,
        model: torch.nn.Module,
        attn_backend: AttentionBackend,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        device: torch.device,
        batch_sizes: list[int],
        compile_batch_sizes: Sequence[int] = (),
        capture: GraphCapture | None = None,
    ) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.device = device
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.compile_batch_sizes = set(compile_batch_sizes)
        self.inputs = GraphInputs.allocate(
            self.max_bs, device, req_to_token_pool.dummy_row, attn_backend.cuda_graph_seq_len_fill_value
        )
        attn_backend.init_cuda_graph_state(self.batch_sizes, req_to_token_pool.req_to_token.shape[1])
        self._capture = capture or CudaGraphCapture(device)
        # NOTE: what the decode line's `cuda graph` reports: a replayed CUDA graph, not a compiled CPU forward.
        self.graph_kind = "cpu" if capture is CompiledReplay else "cuda"
        self.replays_cuda_graphs = self.graph_kind == "cuda"
        # NOTE: every graph writes its logits into this one buffer, so captured sizes do not each keep their own.
        self.logits = torch.empty(self.max_bs, model.config.vocab_size, dtype=model.lm_head_weight.dtype, device=device)
        self._compiled: Callable[[ForwardBatch], torch.Tensor] | None = None
        self.graphs: dict[int, Replayable] = {}
        self.capture_seconds = 0.0
        self.mem_usage_gib = 0.0
        self.avail_mem_gib = 0.0

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.mode.is_decode and batch.batch_size <= self.max_bs

    # ---- capture ----
    def capture(self) -> None:
        before = available_memory_gib(self.device)
        logger.info(f"Capture {self.graph_kind} graph begin. This can take up to several minutes. "
                    f"avail mem={before:.2f} GB")
        start = time.perf_counter()
        try:
            with _frozen_gc(), torch.inference_mode():
                for bs in reversed(self.batch_sizes):
                    self.graphs[bs] = self._capture_one(bs)
        except RuntimeError as exc:
            raise RuntimeError(f"Capture {self.graph_kind} graph failed: {exc}\n{CAPTURE_FAILED_HINT}") from exc
        self.capture_seconds = time.perf_counter() - start
        self.avail_mem_gib = available_memory_gib(self.device)
        self.mem_usage_gib = before - self.avail_mem_gib
        logger.info(
            f"Capture {self.graph_kind} graph end. Time elapsed: {self.capture_seconds:.2f} s. "
            f"mem usage={self.mem_usage_gib:.2f} GB. avail mem={self.avail_mem_gib:.2f} GB."
        )

    def _capture_one(self, bs: int) -> Replayable:
        forward = self._forward_for(bs)
        for _ in range(self.WARMUP_RUNS):
            forward(self._capture_batch(bs))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        batch = self._capture_batch(bs)
        logits = self.logits[:bs]
        return self._capture(lambda: logits.copy_(forward(batch)))

    def _capture_batch(self, bs: int) -> ForwardBatch:
        """A batch of bs dummy requests over the input buffers, its attention metadata over the backend's."""
        self.inputs.fill_dummy(0, bs)
        batch = self._buffer_batch(bs, [self.inputs.dummy_row] * bs, [self.inputs.seq_len_fill_value] * bs)
        self.attn_backend.init_forward_metadata_capture_cuda_graph(batch)
        return batch

    def _forward_for(self, bs: int) -> Callable[[ForwardBatch], torch.Tensor]:
        if bs not in self.compile_batch_sizes:
            return self.model
        if self._compiled is None:
            self._compiled = compile_decode_forward(self.model, self.attn_backend)
        return self._compiled

    # ---- replay ----
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [n, vocab] of a decode batch of n <= max_bs requests: a view of the graphs' logits buffer, valid
        until the next replay."""
        n = batch.batch_size
        bs = padded_batch_size(self.batch_sizes, n)
        self.inputs.load(batch, bs)
        pad = bs - n
        padded = self._buffer_batch(
            bs, batch.req_pool_indices_cpu + [self.inputs.dummy_row] * pad,
            batch.seq_lens_cpu + [self.inputs.seq_len_fill_value] * pad,
        )
        self.attn_backend.init_forward_metadata_replay_cuda_graph(padded, n)
        self.graphs[bs].replay()
        return self.logits[:n]

    def _buffer_batch(self, bs: int, req_pool_indices_cpu: list[int], seq_lens_cpu: list[int]) -> ForwardBatch:
        inputs = self.inputs
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=inputs.input_ids[:bs],
            positions=inputs.positions[:bs],
            out_cache_loc=inputs.out_cache_loc[:bs],
            req_pool_indices=inputs.req_pool_indices[:bs],
            req_pool_indices_cpu=req_pool_indices_cpu,
            seq_lens=inputs.seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            extend_prefix_lens_cpu=[n - 1 for n in seq_lens_cpu],
            extend_seq_lens_cpu=[1] * bs,
            req_to_token=self.req_to_token_pool.req_to_token,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )


def compile_decode_forward(model: torch.nn.Module, attn_backend: AttentionBackend) -> Callable:
    """SGLang's torch.compile setup for the decode graphs: static shapes (one compile per captured size), no
    inductor CUDA graphs (ours capture the compiled kernels). Attention stays eager: its kernels are our own."""
    import torch._dynamo.config
    import torch._inductor.config

    torch._dynamo.config.cache_size_limit = 1024
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    torch._inductor.config.fx_graph_cache = True
    on_cpu = next(model.parameters()).device.type == "cpu"
    # NOTE: on a CPU, freezing lets inductor pre-pack the linear weights for oneDNN (as our eager path does), and
    # autotuning GEMM templates per size costs minutes for little: the default mode.
    torch._inductor.config.freezing = on_cpu
    torch._inductor.config.coordinate_descent_tuning = not on_cpu
    # NOTE: an instance attribute shadows the class method, so only this backend's calls leave the compiled graph.
    attn_backend.forward = torch.compiler.disable(attn_backend.forward)
    return torch.compile(model.forward, mode=None if on_cpu else "max-autotune-no-cudagraphs", dynamic=False)


@contextmanager
def _frozen_gc() -> Iterator[None]:
    """No garbage collection during capture (it can free tensors a graph is being recorded against)."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
