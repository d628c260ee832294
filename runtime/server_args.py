"""The one set of server arguments, shared by `toolkit serve`, the offline `Engine` and the scheduler.

Flag names and meanings follow SGLang. `resolve_defaults` fills the values SGLang derives from the
device (docs/scheduling.md §4) once the device memory is known; everything else is a plain default here.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from dataclasses import dataclass
from typing import Any, Literal, Sequence

SchedulePolicy = Literal["fcfs", "lpm", "dfs-weight", "lof", "random"]
SCHEDULE_POLICIES: tuple[str, ...] = ("fcfs", "lpm", "dfs-weight", "lof", "random")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "torch_native", "triton", "flashinfer")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors", "gguf", "dummy")
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8_e5m2", "fp8_e4m3")
LOAD_BALANCE_METHODS: tuple[str, ...] = ("round_robin", "shortest_queue", "minimum_tokens")
SAMPLING_BACKENDS: tuple[str, ...] = ("pytorch",)
SECRET_FIELDS: tuple[str, ...] = ("api_key",)
REDACTED = "***"


def redacted(secret: str | None) -> str | None:
    """How a secret appears in logs and responses: '***' when set, None when not."""
    return None if secret is None else REDACTED


@dataclass(repr=False)
class ServerArgs:
    # Model
    model_path: str | None = None
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    context_length: int | None = None
    load_format: str = "auto"
    chat_template: str | None = None
    json_model_override_args: str = "{}"
    device: str = "auto"
    random_seed: int | None = None
    quantization: str | None = None
    # HTTP
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    log_requests: bool = False
    log_level: str = "info"
    stream_interval: int = 1
    log_file: str | None = None
    # Memory and scheduling
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    page_size: int | None = None  # None: the device's default (1 with CUDA, 16 on a CPU)
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
    disable_overlap_schedule: bool | None = None  # None: the device's default (on with CUDA, off on a CPU)
    decode_log_interval: int = 40
    watchdog_timeout: float = 300.0
    allow_auto_truncate: bool = False
    # Kernels
    attention_backend: str = "auto"
    sampling_backend: str | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: list[int] | None = None
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    # Parallelism
    tp_size: int = 1
    dp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    load_balance_method: str = "round_robin"
    base_gpu_id: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject values SGLang would reject, naming the flag."""
        _check_choice("--dtype", self.dtype, DTYPES)
        _check_choice("--load-format", self.load_format, LOAD_FORMATS)
        _check_choice("--schedule-policy", self.schedule_policy, SCHEDULE_POLICIES)
        _check_choice("--attention-backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("--kv-cache-dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _check_choice("--load-balance-method", self.load_balance_method, LOAD_BALANCE_METHODS)
        if self.sampling_backend is not None:
            _check_choice("--sampling-backend", self.sampling_backend, SAMPLING_BACKENDS)
        _check_choice("--device", self.device, ("auto", "cpu", "cuda"))
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"--quantization {self.quantization}: supported values are fp8")
        if self.page_size is not None and self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.schedule_conservativeness <= 0:
            raise ValueError(f"--schedule-conservativeness must be > 0, got {self.schedule_conservativeness}")
        if self.decode_log_interval < 1:
            raise ValueError(f"--decode-log-interval must be >= 1, got {self.decode_log_interval}")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be >= 1, got {self.stream_interval}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"--max-prefill-tokens must be >= 1, got {self.max_prefill_tokens}")
        for flag, value in (("--max-running-requests", self.max_running_requests),
                            ("--max-total-tokens", self.max_total_tokens),
                            ("--context-length", self.context_length)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise ValueError("--chunked-prefill-size must be positive, or -1 to disable chunking")
        try:
            json.loads(self.json_model_override_args)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--json-model-override-args is not valid JSON: {exc}") from None
        self._validate_parallelism()

    def _validate_parallelism(self) -> None:
        for flag, value in (("--tp-size", self.tp_size), ("--dp-size", self.dp_size), ("--nnodes", self.nnodes)):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if self.base_gpu_id < 0:
            raise ValueError(f"--base-gpu-id must be >= 0, got {self.base_gpu_id}")
        if self.dist_timeout is not None and self.dist_timeout < 1:
            raise ValueError(f"--dist-timeout must be >= 1 second, got {self.dist_timeout}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank}: must be in [0, --nnodes {self.nnodes})")
        if self.dist_init_addr is not None:
            split_host_port(self.dist_init_addr)
        if self.nnodes > 1:
            if self.dist_init_addr is None:
                raise ValueError(f"--nnodes {self.nnodes} needs --dist-init-addr HOST:PORT (node 0's address, "
                                 "the same on every node)")
            if self.tp_size % self.nnodes:
                raise ValueError(f"--tp-size {self.tp_size} must be a multiple of --nnodes {self.nnodes} (every node "
                                 "runs the same number of TP ranks)")
            if self.dp_size > 1:
                raise ValueError(f"--dp-size {self.dp_size} with --nnodes {self.nnodes}: data parallelism runs on one "
                                 "node; start one server per node instead")

    @property
    def tp_ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def chunked_prefill_enabled(self) -> bool:
        return self.chunked_prefill_size is not None and self.chunked_prefill_size > 0

    @property
    def model_overrides(self) -> dict[str, Any]:
        return json.loads(self.json_model_override_args)

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """The dataclass form (the `server_args=` log line reads it) with every secret shown as '***'."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown.update({name: redacted(shown[name]) for name in SECRET_FIELDS})
        return f"ServerArgs({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values themselves, for the log handlers that mask them."""
        return tuple(value for name in SECRET_FIELDS if (value := getattr(self, name)))


def split_host_port(address: str) -> tuple[str, int]:
    """`--dist-init-addr HOST:PORT` (IPv6 hosts in brackets) as (host, port); a clear error otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {address!r}: expected HOST:PORT, e.g. 10.0.0.1:5000")
    return host, int(port)


def _check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{flag} {value!r}: expected one of {', '.join(choices)}")


# ---- argparse, grouped the way `python -m sglang.launch_server --help` groups its flags ----

_GROUPS: dict[str, tuple[str, ...]] = {
    "Model and tokenizer": (
        "model_path", "tokenizer_path", "served_model_name", "dtype", "kv_cache_dtype", "context_length",
        "load_format", "chat_template", "json_model_override_args", "device", "random_seed", "quantization",
    ),
    "HTTP server": (
        "host", "port", "api_key", "enable_metrics", "enable_cache_report", "log_requests", "log_level",
        "stream_interval", "log_file",
    ),
    "Memory and scheduling": (
        "mem_fraction_static", "max_running_requests", "max_total_tokens", "chunked_prefill_size",
        "max_prefill_tokens", "schedule_policy", "schedule_conservativeness", "page_size", "disable_radix_cache",
        "enable_mixed_chunk", "disable_overlap_schedule", "decode_log_interval", "watchdog_timeout",
        "allow_auto_truncate",
    ),
    "Kernels and optimizations": (
        "attention_backend", "sampling_backend", "disable_cuda_graph", "cuda_graph_max_bs", "cuda_graph_bs",
        "enable_torch_compile", "torch_compile_max_bs",
    ),
    "Parallelism": ("tp_size", "dp_size", "load_balance_method", "nnodes", "node_rank", "dist_init_addr",
                    "dist_timeout", "base_gpu_id"),
}

_HELP: dict[str, str] = {
    "model_path": "Model folder (config.json + safetensors), a .gguf file, or a preset name with "
                  "--load-format dummy. Default: the embedded SmolLM2-135M-Instruct.",
    "tokenizer_path": "Tokenizer folder or .gguf file (default: the model's).",
    "served_model_name": "The model name reported by /v1/models (default: derived from --model-path).",
    "dtype": "Weight and activation dtype. auto: bfloat16 unless the model is float32.",
    "kv_cache_dtype": "KV cache dtype: auto (the model's), or fp8_e5m2 / fp8_e4m3 (one byte per value: twice the "
                      "tokens per GB; scale 1.0, or the checkpoint's per-layer k_scale/v_scale).",
    "context_length": "Maximum context length (default: the model's).",
    "load_format": "auto, safetensors, gguf, or dummy (random weights for the config).",
    "chat_template": "A Jinja chat template file or string overriding the tokenizer's.",
    "json_model_override_args": "JSON dict overriding fields of the model config.",
    "device": "auto picks CUDA when available, else CPU.",
    "random_seed": "Seed for dummy weights and sampling.",
    "quantization": "fp8: linear weights in float8 e4m3 with per-channel scales (bf16/fp16 checkpoints are "
                    "quantized at load; fp8 checkpoints load as they are). GEMMs run in fp8 on CUDA (sm89+), "
                    "dequantized per GEMM elsewhere.",
    "host": "Bind address (default 127.0.0.1).",
    "port": "HTTP port.",
    "api_key": "Require `Authorization: Bearer KEY` on every endpoint but /health.",
    "enable_metrics": "Expose Prometheus metrics at /metrics.",
    "enable_cache_report": "Report cached prompt tokens in usage.prompt_tokens_details.",
    "log_requests": "Log each request's inputs and outputs.",
    "log_level": "Logging level.",
    "stream_interval": "Stream every N tokens.",
    "log_file": "Also write the log to this file.",
    "mem_fraction_static": "Fraction of device memory for weights and KV pool.",
    "max_running_requests": "Cap on concurrently running requests.",
    "max_total_tokens": "Cap on the KV pool size in tokens.",
    "chunked_prefill_size": "Max tokens per prefill chunk; -1 disables chunking.",
    "max_prefill_tokens": "Token budget of one prefill batch (the first request may exceed it).",
    "schedule_policy": "Waiting-queue order: fcfs, lpm (longest prefix match), dfs-weight, lof, random.",
    "schedule_conservativeness": "Scales the new-token ratio; higher admits fewer requests (fewer retractions).",
    "page_size": "Tokens per KV page. Default: 1 with CUDA (SGLang's); 16 on a CPU, where a request's decode "
                 "tokens then sit together in its pages for the in-place decode kernel.",
    "disable_radix_cache": "Disable the radix prefix cache.",
    "enable_mixed_chunk": "Let decode requests ride along in prefill batches.",
    "disable_overlap_schedule": "Run each step to the end before scheduling the next. The default with CUDA "
                                "overlaps the host's work with the forward of the step in flight; on a CPU, where "
                                "the forward already uses every core, overlap is off unless "
                                "--enable-overlap-schedule.",
    "decode_log_interval": "Log a `Decode batch.` line every N decode steps.",
    "watchdog_timeout": "Seconds a forward pass may take before the watchdog kills the server.",
    "allow_auto_truncate": "Truncate prompts longer than the context instead of rejecting them.",
    "attention_backend": "auto, torch_native, triton or flashinfer.",
    "sampling_backend": "pytorch (the only sampler here: torch ops on the device; SGLang's flashinfer sampling "
                        "kernels are not implemented, so that value is refused).",
    "disable_cuda_graph": "Run decode eagerly.",
    "cuda_graph_max_bs": "Largest decode batch captured in a CUDA graph.",
    "cuda_graph_bs": "Explicit list of batch sizes to capture.",
    "enable_torch_compile": "torch.compile the decode path.",
    "torch_compile_max_bs": "Largest batch compiled with torch.compile.",
    "tp_size": "Tensor parallel size (alias --tp): the model is sharded over this many ranks (torch.distributed: "
               "NCCL on CUDA, gloo on CPU).",
    "dp_size": "Data parallel size: this many engine replicas (each its own TP group) behind the HTTP server.",
    "load_balance_method": "How requests are routed to the DP replicas: round_robin, shortest_queue (fewest open "
                           "requests), minimum_tokens (fewest tokens held by open requests).",
    "nnodes": "Number of nodes the TP group spans; start `toolkit serve` once per node with its --node-rank.",
    "node_rank": "This node's rank; node 0 serves HTTP.",
    "dist_init_addr": "HOST:PORT where node 0's TP rank 0 listens for the other ranks (needed with --nnodes > 1).",
    "dist_timeout": "Seconds to wait for every TP rank to join the group (default 300).",
    "base_gpu_id": "First GPU of this node (CUDA): rank r of replica d uses base + d * ranks-per-node + r.",
}

_CHOICES: dict[str, Sequence[str]] = {
    "dtype": DTYPES,
    "load_format": LOAD_FORMATS,
    "schedule_policy": SCHEDULE_POLICIES,
    "attention_backend": ATTENTION_BACKENDS,
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "load_balance_method": LOAD_BALANCE_METHODS,
    "sampling_backend": SAMPLING_BACKENDS,
    "device": ("auto", "cpu", "cuda"),
    "log_level": ("debug", "info", "warning", "error", "critical"),
    "quantization": ("fp8",),
}


# SGLang's short spellings of a few flags.
_ALIASES: dict[str, tuple[str, ...]] = {
    "tp_size": ("--tp", "--tensor-parallel-size"),
    "dp_size": ("--data-parallel-size",),
}


class SuggestingArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose error for an unknown flag names the closest known flags."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            unknown = [a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")]
            known = [opt for action in self._actions for opt in action.option_strings]
            hints = []
            for flag in unknown:
                close = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
                if close:
                    hints.append(f"{flag}: did you mean {' or '.join(close)}?")
            if hints:
                message = message + "\n" + "\n".join(hints)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _field_type(f: dataclasses.Field) -> str:
    return str(f.type).replace(" ", "")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    fields = {f.name: f for f in dataclasses.fields(ServerArgs)}
    for title, names in _GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            _add_argument(group, fields[name])


def _add_argument(group: argparse._ArgumentGroup, f: dataclasses.Field) -> None:
    flags = ("--" + f.name.replace("_", "-"), *_ALIASES.get(f.name, ()))
    kind = _field_type(f)
    help_text = _HELP.get(f.name, "")
    default = f.default if f.default is not dataclasses.MISSING else None
    if kind == "bool":
        group.add_argument(*flags, action="store_true", help=help_text)
        return
    if kind == "bool|None":  # a flag pair: --disable-X sets True, its --enable-X twin False, neither the default
        enable = "--enable-" + f.name.removeprefix("disable_").replace("_", "-")
        group.add_argument(*flags, dest=f.name, action="store_const", const=True, default=None, help=help_text)
        group.add_argument(enable, dest=f.name, action="store_const", const=False,
                           help=f"The opposite of {flags[0]}, on any device.")
        return
    if kind.startswith("list[int]"):
        group.add_argument(*flags, type=int, nargs="+", default=default, help=help_text)
        return
    caster = int if kind.startswith("int") else float if kind.startswith("float") else str
    group.add_argument(
        *flags, dest=f.name, type=caster, default=default, choices=_CHOICES.get(f.name), metavar=f.name.upper(),
        help=f"{help_text} (default: {default})" if default is not None else help_text,
    )


def build_parser(prog: str = "toolkit serve") -> SuggestingArgumentParser:
    parser = SuggestingArgumentParser(
        prog=prog, description="Launch the toolkit LLM server (SGLang-compatible flags)."
    )
    add_cli_args(parser)
    return parser


def parse_server_args(argv: Sequence[str], prog: str = "toolkit serve") -> ServerArgs:
    """Parse command-line flags; a bad value exits with argparse's error naming the flag."""
    parser = build_parser(prog)
    namespace = parser.parse_args(list(argv))
    try:
        return ServerArgs(**vars(namespace))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def default_served_model_name(args: ServerArgs) -> str:
    from pathlib import Path

    if args.served_model_name:
        return args.served_model_name
    if not args.model_path:
        from toolkit.runtime.model_loader.embedded import EMBEDDED_MODEL_NAME

        return EMBEDDED_MODEL_NAME
    path = Path(args.model_path)
    return path.stem if path.suffix == ".gguf" else path.name or str(path)

