"""Owns the model and its KV memory on one device: loads weights, sizes the pool, runs forward passes."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import torch

from toolkit.runtime import cpu_capability
from toolkit.runtime.attention.base import AttentionBackend
from toolkit.runtime.attention.registry import create_backend
from toolkit.runtime.cuda_graph_runner import CompiledReplay, CudaGraphRunner, capture_batch_sizes
from toolkit.runtime.cpu_threads import CpuThreadPolicy
from toolkit.runtime.device_defaults import TORCH_DTYPES, with_device_defaults
from toolkit.runtime.memory.device import available_memory_gib, resolve_device
from toolkit.runtime.forward_batch import ForwardBatch
from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.kv_pool import KVPool
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.memory.planning import PoolPlan, plan_cpu_pool, plan_cuda_pool, req_to_token_pool_size
from toolkit.runtime.model_loader.config import ModelConfig
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.loader import ModelSource, resolve_model_source
from toolkit.runtime.models.cpu_packing import pack_for_cpu, resident_weight_bytes
from toolkit.runtime.models.decoder import CausalLM
from toolkit.runtime.models.fp8 import describe_gemm
from toolkit.runtime.models.registry import MODEL_CLASSES
from toolkit.runtime.models.tp_shard import AttentionShard, tp_coordinates, tp_size_error
from toolkit.runtime.models.weights import init_dummy_weights, load_weights
from toolkit.runtime.server_args import ServerArgs

if TYPE_CHECKING:
    from toolkit.runtime.distributed.group import TPGroup

logger = logging.getLogger("runtime")
GIB = 1 << 30

class ForwardOutput(NamedTuple):
    logits: torch.Tensor
    used_cuda_graph: bool


KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def cuda_graph_disabled_reason(device: torch.device, args: ServerArgs, backend: AttentionBackend) -> str | None:
    """Why decode CUDA graphs are not captured here, or None when they are. On a CPU, `--enable-torch-compile`
    compiles the decode forward per batch size instead (no graphs there)."""
    if device.type == "cpu" and args.enable_torch_compile:
        return None if backend.supports_cuda_graph else (
            f"--attention-backend {backend.name} on this CPU cannot run a compiled decode step")
    if device.type != "cuda":
        return f"the device is {device.type}"
    if args.disable_cuda_graph:
        return "--disable-cuda-graph is set"
    if not backend.supports_cuda_graph:
        return f"--attention-backend {backend.name} does not support it"
    return None


def check_tp_size(config: ModelConfig, tp_size: int) -> None:
    error = tp_size_error(config, tp_size)
    if error is not None:
        raise ModelLoadError(error)


def build_model(config: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype,
                tp: TPGroup | None = None, quantization: str | None = None) -> CausalLM:
    """Construct without initializing (meta device), then materialize on `device` in `dtype`."""
    with _default_dtype(dtype), torch.device("meta"):
        model = MODEL_CLASSES[config.architecture](config, max_positions, tp, quantization)
    model = model.to_empty(device=device)
    model.model.rotary.build_cache(device)
    return model.eval()


class ModelRunner:
    """`tp`: this rank's TP group (None for one device): the model holds this rank's shard and the KV pool its KV
    heads, sized from the smallest rank's memory. `host_processes`: scheduler processes sharing this host's CPU
    RAM budget. Arguments not yet resolved are resolved here against the model (`device_defaults`)."""

    def __init__(self, args: ServerArgs, source: ModelSource | None = None,
                 tp: TPGroup | None = None, host_processes: int = 1) -> None:
        self.source = source or resolve_model_source(
            args.model_path, args.load_format, args.tokenizer_path, args.context_length, args.model_overrides
        )
        self.config = self.source.config
        self.args = args = with_device_defaults(args, self.config)
        self.device = resolve_device(args.device)
        self.tp = tp
        self.host_processes = host_processes
        self.cpu_threads = CpuThreadPolicy() if self.device.type == "cpu" else None
        self.dtype = TORCH_DTYPES[args.dtype]
        if self.device.type == "cpu":
            cpu_capability.log_once(self.dtype)
        self.context_len = args.context_length or self.config.max_position_embeddings
        self.mem_key = "available_gpu_mem" if self.device.type == "cuda" else "available_cpu_mem"
        self.model = self._load_model()
        self.plan = self._plan_pool()
        self.max_total_num_tokens = self.plan.max_total_num_tokens
        self._allocate_pools()
        self.attn_backend = create_backend(args.attention_backend, self.device)
        self.graph_runner = self._init_cuda_graphs()

    def _load_model(self) -> CausalLM:
        self.avail_before_weights = available_memory_gib(self.device)
        logger.info(f"Load weight begin. avail mem={self.avail_before_weights:.2f} GB")
        start = time.perf_counter()
        model = build_model(self.config, self.context_len, self.device, self.dtype, self.tp, self.quantization)
        if self.source.weights is None:
            init_dummy_weights(model, self.args.random_seed or 0)
        else:
            load_weights(model, self.source.weights())
        if self.quantization == "fp8":
            logger.info(f"Quantization fp8: {describe_gemm(self.device)}")
        if self.device.type == "cpu" and not self.args.enable_torch_compile:
            pack_for_cpu(model)  # NOTE: a compiled forward has inductor pack the weights itself (freezing)
        if self.device.type == "cpu":
            # NOTE: RAM's MemAvailable moves with every other process on the host; the model's own bytes are exact.
            self.avail_after_weights = self.avail_before_weights - resident_weight_bytes(model) / GIB
        else:
            self.avail_after_weights = available_memory_gib(self.device)
        usage = self.avail_before_weights - self.avail_after_weights
        logger.info(
            f"Load weight end. type={self.config.architecture}, dtype={self.dtype}, "
            f"avail mem={self.avail_after_weights:.2f} GB, mem usage={max(usage, 0.0):.2f} GB."
        )
        self.weight_load_seconds = time.perf_counter() - start
        return model

    @property
    def quantization(self) -> str | None:
        return self.args.quantization

    @property
    def attention_backend_name(self) -> str:
        return self.args.attention_backend

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank stores (its shard, or a replica when there are fewer KV heads than ranks)."""
        return AttentionShard.of(self.config, *tp_coordinates(self.tp)).num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """SGLang's `cell_size` for this rank: K and V of every layer, its KV heads, in the KV cache dtype."""
        config, itemsize = self.config, torch.tensor([], dtype=self.kv_dtype).element_size()
        return self.num_kv_heads * config.head_dim * config.num_hidden_layers * 2 * itemsize

    @property
    def kv_dtype(self) -> torch.dtype:
        return KV_CACHE_DTYPES.get(self.args.kv_cache_dtype, self.dtype)

    def kv_scales(self) -> list[tuple[float, float]]:
        """Per layer (k_scale, v_scale) of an fp8 KV cache: the checkpoint's, else SGLang's default 1.0."""
        if self.kv_dtype not in KV_CACHE_DTYPES.values():
            return [(1.0, 1.0)] * self.config.num_hidden_layers
        return [(layer.self_attn.k_scale, layer.self_attn.v_scale) for layer in self.model.model.layers]

    def _plan_pool(self) -> PoolPlan:
        args = self.args
        if self.device.type == "cuda":
            plan = plan_cuda_pool(
                self.avail_before_weights, self.avail_after_weights, args.mem_fraction_static,
                self.kv_bytes_per_token, args.page_size, args.max_total_tokens,
            )
        else:
            plan = plan_cpu_pool(
                self.avail_before_weights, self.avail_after_weights, self.kv_bytes_per_token,
                args.page_size, args.max_total_tokens, args.mem_fraction_static, self.host_processes,
            )
        if plan.warning:
            logger.warning(plan.warning)
        if self.tp is not None:
            # NOTE: every rank schedules the same batches, so every rank's pool has the smallest rank's size.
            plan = PoolPlan(self.tp.min_int(plan.max_total_num_tokens), plan.warning)
        return plan

    def _allocate_pools(self) -> None:
        config, page_size = self.config, self.args.page_size
        rows = self.args.max_running_requests or req_to_token_pool_size(self.max_total_num_tokens, self.context_len)
        self.req_to_token_pool = ReqToTokenPool(rows + 1, self.context_len + page_size, self.device)
        self.kv_pool = KVPool(
            self.max_total_num_tokens, page_size, config.num_hidden_layers, self.num_kv_heads,
            config.head_dim, self.kv_dtype, self.device, self.kv_scales(),
        )
        self.allocator = TokenAllocator(self.max_total_num_tokens, page_size, self.device)
        half_gib = self.max_total_num_tokens * self.kv_bytes_per_token / 2 / (1 << 30)
        logger.info(
            f"KV Cache is allocated. #tokens: {self.max_total_num_tokens}, "
            f"K size: {half_gib:.2f} GB, V size: {half_gib:.2f} GB"
        )
        self.avail_after_pool = available_memory_gib(self.device)
        logger.info(f"Memory pool end. avail mem={self.avail_after_pool:.2f} GB")

    def _init_cuda_graphs(self) -> CudaGraphRunner | None:
        """Capture decode graphs after the KV pool, in the memory `--mem-fraction-static` leaves (SGLang's order);
        the startup line's free memory is then what is left after them."""
        args = self.args
        reason = cuda_graph_disabled_reason(self.device, args, self.attn_backend)
        if reason is not None:
            if self.device.type == "cuda" and not args.disable_cuda_graph:
                logger.info(f"Cuda graph is disabled because {reason}.")
            if args.enable_torch_compile:
                logger.info(f"--enable-torch-compile has no effect: it compiles the decode CUDA graphs, which are off "
                            f"({reason}).")
            return None
        if self.device.type == "cpu":
            sizes = capture_batch_sizes(args.cuda_graph_bs, args.torch_compile_max_bs, self.req_to_token_pool.size)
            compile_sizes = sizes
        else:
            sizes = capture_batch_sizes(args.cuda_graph_bs, args.cuda_graph_max_bs, self.req_to_token_pool.size)
            compile_sizes = [bs for bs in sizes if bs <= args.torch_compile_max_bs] if args.enable_torch_compile else []
        runner = CudaGraphRunner(
            self.model, self.attn_backend, self.kv_pool, self.req_to_token_pool, self.device, sizes, compile_sizes,
            capture=CompiledReplay if self.device.type == "cpu" else None,
        )
        runner.capture()
        self.avail_after_pool = runner.avail_mem_gib  # NOTE: SGLang's startup line reports memory after capture
        return runner

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Logits [batch, vocab] in the model's dtype for each request's last new token, and whether a captured
        graph ran (the decode log line's `cuda graph`). A replayed graph's logits are a view valid until the next
        forward."""
        if self.cpu_threads is not None:
            self.cpu_threads.apply(batch.mode.is_decode)
        graphs = self.graph_runner
        if graphs is not None and graphs.can_run(batch):
            return ForwardOutput(graphs.replay(batch), used_cuda_graph=graphs.replays_cuda_graphs)
        return ForwardOutput(self.model(batch), used_cuda_graph=False)
