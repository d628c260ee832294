"""The one set of server arguments, shared by `toolkit serve`, the offline `Engine` and the scheduler.

Flag names and meanings follow SGLang. Each field declares its flag once (`flag(...)`: group, help, choices,
aliases, lower bound, whether the device fills it); argparse, `validate`, `--help` and the README table's test
derive from that. The defaults SGLang derives from the device are filled once, into a frozen `ResolvedArgs`
(`runtime/device_defaults.py`, docs/scheduling.md §4), which the model runner and the scheduler receive.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

REDACTED = "***"
FLAG = "flag"  # the key of a field's `Flag` in its metadata

MODEL = "Model and tokenizer"
HTTP = "HTTP server"
MEMORY = "Memory and scheduling"
KERNELS = "Kernels and optimizations"
PARALLELISM = "Parallelism"
CONSTRAINED = "Constrained decoding"


@dataclass(frozen=True)
class Flag:
    """How a `ServerArgs` field appears on the command line. `from_device`: None here until the device fills it,
    on any device or only with CUDA (`ResolvedArgs` checks it was). `auto_resolved`: its `auto` is replaced by the
    concrete value the device and the model decide (`ResolvedArgs` checks it was)."""

    group: str
    help: str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()
    minimum: int | None = None
    from_device: Literal["any", "cuda"] | None = None
    auto_resolved: bool = False
    secret: bool = False


def flag(default: Any, group: str, help: str, **spec: Any) -> Any:
    return field(default=default, metadata={FLAG: Flag(group, help, **spec)})


def redacted(secret: str | None) -> str | None:
    """How a secret appears in logs and responses: '***' when set, None when not."""
    return None if secret is None else REDACTED


@dataclass(repr=False, frozen=True)
class ServerArgs:
    model_path: str | None = flag(
        None, MODEL, "Model folder (config.json + safetensors), a .gguf file, or a preset name with --load-format "
        "dummy. Default: the embedded SmolLM2-135M-Instruct.")
    tokenizer_path: str | None = flag(None, MODEL, "Tokenizer folder or .gguf file (default: the model's).")
    served_model_name: str | None = flag(
        None, MODEL, "The model name reported by /v1/models (default: derived from --model-path).")
    dtype: str = flag(
        "auto", MODEL, "Weight and activation dtype. auto: float32 for a float32 checkpoint; else on CUDA float16 "
        "for a float16 checkpoint and bfloat16 otherwise, on a CPU bfloat16 where oneDNN multiplies it natively and "
        "float32 elsewhere.", choices=("auto", "float32", "bfloat16", "float16"), auto_resolved=True)
    kv_cache_dtype: str = flag(
        "auto", MODEL, "KV cache dtype: auto (the model's), or fp8_e5m2 / fp8_e4m3 (one byte per value: twice the "
        "tokens per GB; scale 1.0, or the checkpoint's per-layer k_scale/v_scale).",
        choices=("auto", "fp8_e5m2", "fp8_e4m3"))
    context_length: int | None = flag(None, MODEL, "Maximum context length (default: the model's).", minimum=1)
    load_format: str = flag("auto", MODEL, "auto, safetensors, gguf, or dummy (random weights for the config).",
                            choices=("auto", "safetensors", "gguf", "dummy"))
    chat_template: str | None = flag(None, MODEL, "A Jinja chat template file or string overriding the tokenizer's.")
    json_model_override_args: str = flag("{}", MODEL, "JSON dict overriding fields of the model config.")
    device: str = flag("auto", MODEL, "auto picks CUDA when available, else CPU.", choices=("auto", "cpu", "cuda"),
                       from_device="any")
    random_seed: int | None = flag(None, MODEL, "Seed for dummy weights and sampling.")
    quantization: str | None = flag(
        None, MODEL, "fp8: linear weights in float8 e4m3 with per-channel scales (bf16/fp16 checkpoints are "
        "quantized at load; fp8 checkpoints load as they are). GEMMs run in fp8 on CUDA (sm89+), dequantized per "
        "GEMM elsewhere; default: the checkpoint's quantization_config.quant_method, if any.", choices=("fp8",))

    host: str = flag("127.0.0.1", HTTP, "Bind address (default 127.0.0.1).")
    port: int = flag(30000, HTTP, "HTTP port.")
    api_key: str | None = flag(None, HTTP, "Require `Authorization: Bearer KEY` on every endpoint but /health.",
                               secret=True)
    enable_metrics: bool = flag(False, HTTP, "Expose Prometheus metrics at /metrics.")
    enable_cache_report: bool = flag(False, HTTP, "Report cached prompt tokens in usage.prompt_tokens_details.")
    log_requests: bool = flag(False, HTTP, "Log each request's inputs and outputs.")
    log_level: str = flag("info", HTTP, "Logging level.", choices=("debug", "info", "warning", "error", "critical"))
    stream_interval: int = flag(1, HTTP, "Stream every N tokens.", minimum=1)
    log_file: str | None = flag(None, HTTP, "Also write the log to this file.")

    mem_fraction_static: float | None = flag(None, MEMORY, "Fraction of device memory for weights and KV pool.",
                                             from_device="cuda")
    max_running_requests: int | None = flag(None, MEMORY, "Cap on concurrently running requests.", minimum=1)
    max_queued_requests: int | None = flag(
        None, MEMORY, "Cap on the requests waiting to be scheduled: a request that would make the waiting queue "
        "longer gets 503 at once, with Retry-After (per DP replica; default: no cap).", minimum=0)
    queue_timeout: float | None = flag(
        None, MEMORY, "Seconds a request may wait in the queue before it is first scheduled; past that it is "
        "aborted and answered 503 (SGLang's SGLANG_REQ_WAITING_TIMEOUT; default: no limit).")
    max_total_tokens: int | None = flag(None, MEMORY, "Cap on the KV pool size in tokens.", minimum=1)
    chunked_prefill_size: int | None = flag(None, MEMORY, "Max tokens per prefill chunk; -1 disables chunking.",
                                            from_device="any")
    max_prefill_tokens: int = flag(
        16384, MEMORY, "Token budget of one prefill batch (the first request may exceed it).", minimum=1)
    schedule_policy: str = flag(
        "fcfs", MEMORY, "Waiting-queue order: fcfs, lpm (longest prefix match), dfs-weight, lof, random.",
        choices=("fcfs", "lpm", "dfs-weight", "lof", "random"))
    schedule_conservativeness: float = flag(
        1.0, MEMORY, "Scales the new-token ratio; higher admits fewer requests (fewer retractions).")
    page_size: int | None = flag(
        None, MEMORY, "Tokens per KV page. Default: 1 with CUDA (SGLang's); 16 on a CPU, where a request's decode "
        "tokens then sit together in its pages for the in-place decode kernel.", minimum=1, from_device="any")
    disable_radix_cache: bool = flag(False, MEMORY, "Disable the radix prefix cache.")
    enable_mixed_chunk: bool = flag(False, MEMORY, "Let decode requests ride along in prefill batches.")
    disable_overlap_schedule: bool | None = flag(
        None, MEMORY, "Run each step to the end before scheduling the next. The default with CUDA overlaps the "
        "host's work with the forward of the step in flight; on a CPU, where the forward already uses every core, "
        "overlap is off unless --enable-overlap-schedule.", from_device="any")
    decode_log_interval: int = flag(40, MEMORY, "Log a `Decode batch.` line every N decode steps.", minimum=1)
    watchdog_timeout: float = flag(300.0, MEMORY, "Seconds a forward pass may take before the watchdog kills the "
                                   "server.")
    allow_auto_truncate: bool = flag(False, MEMORY, "Truncate prompts longer than the context instead of rejecting "
                                     "them.")

    attention_backend: str = flag(
        "auto", KERNELS, "auto, torch_native, triton or flashinfer. auto: flashinfer on CUDA where it can run, else "
        "triton; torch_native on a CPU.", choices=("auto", "torch_native", "triton", "flashinfer"), auto_resolved=True)
    sampling_backend: str | None = flag(
        None, KERNELS, "pytorch (the only sampler here: torch ops on the device; SGLang's flashinfer sampling "
        "kernels are not implemented, so that value is refused).", choices=("pytorch",))
    disable_cuda_graph: bool = flag(False, KERNELS, "Run decode eagerly.")
    cuda_graph_max_bs: int | None = flag(None, KERNELS, "Largest decode batch captured in a CUDA graph.",
                                         from_device="cuda")
    cuda_graph_bs: list[int] | None = flag(None, KERNELS, "Explicit list of batch sizes to capture.")
    enable_torch_compile: bool = flag(False, KERNELS, "torch.compile the decode path.")
    torch_compile_max_bs: int = flag(32, KERNELS, "Largest batch compiled with torch.compile.")

    tp_size: int = flag(
        1, PARALLELISM, "Tensor parallel size (alias --tp): the model is sharded over this many ranks "
        "(torch.distributed: NCCL on CUDA, gloo on CPU).", aliases=("--tp", "--tensor-parallel-size"), minimum=1)
    dp_size: int = flag(
        1, PARALLELISM, "Data parallel size: this many engine replicas (each its own TP group) behind the HTTP "
        "server.", aliases=("--data-parallel-size",), minimum=1)
    load_balance_method: str = flag(
        "round_robin", PARALLELISM, "How requests are routed to the DP replicas: round_robin, shortest_queue "
        "(fewest open requests), minimum_tokens (fewest tokens held by open requests).",
        choices=("round_robin", "shortest_queue", "minimum_tokens"))
    nnodes: int = flag(1, PARALLELISM, "Number of nodes the TP group spans; start `toolkit serve` once per node "
                       "with its --node-rank.", minimum=1)
    node_rank: int = flag(0, PARALLELISM, "This node's rank; node 0 serves HTTP.")
    dist_init_addr: str | None = flag(
        None, PARALLELISM, "HOST:PORT where node 0's TP rank 0 listens for the other ranks (needed with "
        "--nnodes > 1).")
    dist_timeout: int | None = flag(
        None, PARALLELISM, "Seconds to wait for every TP rank to join the group (default 300).", minimum=1)
    base_gpu_id: int = flag(
        0, PARALLELISM, "First GPU of this node (CUDA): rank r of replica d uses base + d * ranks-per-node + r.",
        minimum=0)

    grammar_backend: str = flag(
        "xgrammar", CONSTRAINED, "The grammar engine of JSON schema, regex, EBNF and tool-call constraints: xgrammar, "
        "or none (constrained requests are refused with 400).", choices=("xgrammar", "none"))
    grammar_compile_timeout: float = flag(
        30.0, CONSTRAINED, "Seconds a grammar may take to compile; past that its request is refused with 400 (and "
        "so is the same grammar again).")
    tool_call_parser: str | None = flag(
        None, CONSTRAINED, "The tool-call format of the model's chat template: llama3 (JSON), qwen25 "
        "(<tool_call> tags), smollm2 (<tool_call>[...]</tool_call>); default: read from the template.",
        choices=("llama3", "qwen25", "smollm2"))

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject values SGLang would reject, naming the flag."""
        for f, spec in flag_fields():
            _check_flag(f.name, getattr(self, f.name), spec)
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.schedule_conservativeness <= 0:
            raise ValueError(f"--schedule-conservativeness must be > 0, got {self.schedule_conservativeness}")
        if not self.grammar_compile_timeout > 0:
            raise ValueError(f"--grammar-compile-timeout must be > 0 seconds, got {self.grammar_compile_timeout}")
        if self.queue_timeout is not None and not self.queue_timeout > 0:
            raise ValueError(f"--queue-timeout must be > 0 seconds, got {self.queue_timeout}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise ValueError("--chunked-prefill-size must be positive, or -1 to disable chunking")
        try:
            json.loads(self.json_model_override_args)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--json-model-override-args is not valid JSON: {exc}") from None
        self._validate_parallelism()

    def _validate_parallelism(self) -> None:
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

    def __repr__(self) -> str:
        """The dataclass form (the `server_args=` log line reads it) with every secret shown as '***'."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown.update({name: redacted(shown[name]) for name in SECRET_FIELDS})
        return f"ServerArgs({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values themselves, for the log handlers that mask them."""
        return tuple(value for name in SECRET_FIELDS if (value := getattr(self, name)))


@dataclass(repr=False, frozen=True)
class ResolvedArgs(ServerArgs):
    """`ServerArgs` with the device's defaults filled and the autos resolved against the device and the model
    (`device_defaults.with_device_defaults`): the device is `cpu` or `cuda`, every `from_device` field the device
    fills holds a value, and no `auto_resolved` field is `auto` (the quantization is the method, or None)."""

    def validate(self) -> None:
        super().validate()
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"resolved arguments name no device: --device {self.device}")
        unfilled = [f.name for f, spec in flag_fields() if getattr(self, f.name) is None
                    and spec.from_device in ("any", self.device)]
        if unfilled:
            raise ValueError(f"the device's defaults were not filled: {', '.join(unfilled)}")
        unresolved = [cli_flag(f.name) for f, spec in flag_fields()
                      if spec.auto_resolved and getattr(self, f.name) == "auto"]
        if unresolved:
            raise ValueError(f"resolved arguments hold an unresolved auto: {', '.join(unresolved)}")


def flag_fields() -> tuple[tuple[dataclasses.Field, Flag], ...]:
    """Every `ServerArgs` field with its flag, in `--help` order."""
    return tuple((f, f.metadata[FLAG]) for f in dataclasses.fields(ServerArgs))


def defaults() -> dict[str, Any]:
    """Each argument's value when no flag sets it (None where the device or the model decides)."""
    return {f.name: f.default for f, _ in flag_fields()}


def cli_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


SECRET_FIELDS: tuple[str, ...] = tuple(f.name for f, spec in flag_fields() if spec.secret)


def split_host_port(address: str) -> tuple[str, int]:
    """`--dist-init-addr HOST:PORT` (IPv6 hosts in brackets) as (host, port); a clear error otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {address!r}: expected HOST:PORT, e.g. 10.0.0.1:5000")
    return host, int(port)


def _check_flag(name: str, value: Any, spec: Flag) -> None:
    if value is None:
        return
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(f"{cli_flag(name)} {value!r}: expected one of {', '.join(spec.choices)}")
    if spec.minimum is not None and value < spec.minimum:
        raise ValueError(f"{cli_flag(name)} must be >= {spec.minimum}, got {value}")


# ---- argparse, grouped the way `python -m sglang.launch_server --help` groups its flags ----

class SuggestingArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose error for an unknown flag names the closest known flags."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            unknown = [a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("-")]
            known = [opt for action in self._actions for opt in action.option_strings]
            hints = []
            for flag_name in unknown:
                close = difflib.get_close_matches(flag_name, known, n=3, cutoff=0.6)
                if close:
                    hints.append(f"{flag_name}: did you mean {' or '.join(close)}?")
            if hints:
                message = message + "\n" + "\n".join(hints)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _field_type(f: dataclasses.Field) -> str:
    return str(f.type).replace(" ", "")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f, spec in flag_fields():
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group)
        _add_argument(groups[spec.group], f, spec)


def _add_argument(group: argparse._ArgumentGroup, f: dataclasses.Field, spec: Flag) -> None:
    flags = (cli_flag(f.name), *spec.aliases)
    kind = _field_type(f)
    if kind == "bool":
        group.add_argument(*flags, action="store_true", help=spec.help)
        return
    if kind == "bool|None":  # a flag pair: --disable-X sets True, its --enable-X twin False, neither the default
        group.add_argument(*flags, dest=f.name, action="store_const", const=True, default=None, help=spec.help)
        group.add_argument(enable_twin(f.name), dest=f.name, action="store_const", const=False,
                           help=f"The opposite of {flags[0]}, on any device.")
        return
    if kind.startswith("list[int]"):
        group.add_argument(*flags, type=int, nargs="+", default=f.default, help=spec.help)
        return
    caster = int if kind.startswith("int") else float if kind.startswith("float") else str
    group.add_argument(
        *flags, dest=f.name, type=caster, default=f.default, choices=spec.choices, metavar=f.name.upper(),
        help=f"{spec.help} (default: {f.default})" if f.default is not None else spec.help,
    )


def enable_twin(name: str) -> str:
    """`--enable-X`, the flag that sets a `disable_X: bool | None` field to False."""
    return cli_flag("enable_" + name.removeprefix("disable_"))


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
