"""Everything between parsed flags and a ready scheduler: this rank's device and threads, its device defaults
(`device_defaults`), its TP group, model, tokenizer, log lines."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from toolkit.runtime.constrained.backend import grammar_backend
from toolkit.runtime.device_defaults import with_device_defaults
from toolkit.runtime.distributed.group import TPGroup
from toolkit.runtime.distributed.topology import RankInfo
from toolkit.runtime.memory.device import resolve_device
from toolkit.runtime.model_loader.loader import ModelSource, resolve_model_source
from toolkit.runtime.model_loader.tokenizer import load_tokenizer
from toolkit.runtime.model_runner import ModelRunner, check_tp_size
from toolkit.runtime.scheduler.scheduler import Scheduler
from toolkit.runtime.server_args import ResolvedArgs, ServerArgs

logger = logging.getLogger("runtime")


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
    args: ResolvedArgs
    source: ModelSource
    tokenizer: object
    runner: ModelRunner
    scheduler: Scheduler
    tp: TPGroup | None = None


def place_rank(args: ServerArgs, rank: RankInfo) -> torch.device:
    """This rank's device (`--base-gpu-id` + its index on the node; current before anything touches CUDA) and, on a
    CPU, its share of the cores."""
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        if rank.gpu_id >= torch.cuda.device_count():
            raise ValueError(f"{rank.name} needs CUDA device {rank.gpu_id} (--base-gpu-id {args.base_gpu_id} + its "
                             f"index on this node) but {torch.cuda.device_count()} are visible; lower --tp-size or "
                             "--dp-size, or --base-gpu-id")
        torch.cuda.set_device(rank.gpu_id)
    elif rank.cpu_threads is not None:
        torch.set_num_threads(rank.cpu_threads)
    return resolve_device(args.device)


def launch_scheduler(args: ServerArgs, rank: RankInfo | None = None,
                     peers_dead: Callable[[], str | None] | None = None,
                     exit_on_silence: bool = False) -> LaunchedScheduler:
    """`rank`: this process's place in its TP group (one device when None); `peers_dead` and `exit_on_silence` go
    to its TPGroup."""
    rank = rank or RankInfo(gpu_id=args.base_gpu_id)
    device = place_rank(args, rank)
    source = model_source(args)
    args = with_device_defaults(args, source.config)
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    if rank.is_leader and rank.dp_rank == 0:
        logger.info(f"server_args={args}")
    check_tp_size(source.config, rank.tp_size)  # NOTE: every rank, before joining: a bad size never hangs a join
    tp = None
    if rank.tp_size > 1:
        tp = TPGroup(rank, device, op_timeout_s=args.watchdog_timeout, peers_dead=peers_dead,
                     exit_on_silence=exit_on_silence)
    tokenizer = load_tokenizer(source.tokenizer_path)
    runner = ModelRunner(args, source, tp=tp, host_processes=rank.host_processes)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    eos = eos_token_ids(source, tokenizer)
    grammars = grammar_backend(args.grammar_backend, tokenizer, source.config.vocab_size, eos)
    scheduler = Scheduler(args, runner, eos, decode, grammars)
    return LaunchedScheduler(args, source, tokenizer, runner, scheduler, tp)
