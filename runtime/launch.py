"""Everything between parsed flags and a ready scheduler: device defaults, model, tokenizer, log lines."""
from __future__ import annotations

import dataclasses
import logging

import torch

from toolkit.runtime.memory.device import resolve_device, total_memory_mib
from toolkit.runtime.memory.planning import CPU_CHUNKED_PREFILL_SIZE, cuda_defaults
from toolkit.runtime.model_loader.loader import ModelSource, resolve_model_source
from toolkit.runtime.model_loader.tokenizer import load_tokenizer
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.scheduler.scheduler import Scheduler
from toolkit.runtime.server_args import ServerArgs

logger = logging.getLogger("runtime")


def with_device_defaults(args: ServerArgs) -> ServerArgs:
    """Fill the flags SGLang derives from the device's memory (docs/scheduling.md §4)."""
    device = resolve_device(args.device)
    if device.type != "cuda":
        return args.replace(
            device="cpu",
            chunked_prefill_size=args.chunked_prefill_size or CPU_CHUNKED_PREFILL_SIZE,
            disable_cuda_graph=True,
        )
    defaults = cuda_defaults(total_memory_mib(device), args.tp_size)
    return args.replace(
        device="cuda",
        chunked_prefill_size=args.chunked_prefill_size or defaults.chunked_prefill_size,
        cuda_graph_max_bs=args.cuda_graph_max_bs or defaults.cuda_graph_max_bs,
        mem_fraction_static=args.mem_fraction_static or defaults.mem_fraction_static,
    )


def model_source(args: ServerArgs) -> ModelSource:
    return resolve_model_source(
        args.model_path, args.load_format, args.tokenizer_path, args.context_length, args.model_overrides
    )


def eos_token_ids(source: ModelSource, tokenizer) -> frozenset[int]:
    ids = set(source.config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


@dataclasses.dataclass
class LaunchedScheduler:
    args: ServerArgs
    source: ModelSource
    tokenizer: object
    runner: ModelRunner
    scheduler: Scheduler


def launch_scheduler(args: ServerArgs, shares_cores: bool = False) -> LaunchedScheduler:
    """`shares_cores`: other processes of ours (the HTTP front end) run beside the model on this host."""
    args = with_device_defaults(args)
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    logger.info(f"server_args={args}")
    source = model_source(args)
    tokenizer = load_tokenizer(source.tokenizer_path)
    runner = ModelRunner(args, source, shares_cores=shares_cores)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    scheduler = Scheduler(args, runner, eos_token_ids(source, tokenizer), decode)
    return LaunchedScheduler(args, source, tokenizer, runner, scheduler)
