"""Which ranks run where: one process per TP rank, `--dp-size` replicas of the TP group, `--nnodes` nodes sharing
one group. Torch-free: the HTTP front end plans the ranks it starts.

Ports: replica d's TP group meets at `--dist-init-addr` HOST:PORT+d, or (one node, no address given) at a free
port of 127.0.0.1 picked by the process that starts the ranks.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from toolkit.runtime.server_args import ServerArgs, split_host_port

DEFAULT_JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class RankInfo:
    """One scheduler process's place: its TP rank in its replica's group, and that group's meeting address."""

    tp_rank: int = 0
    tp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    init_addr: str | None = None  # HOST:PORT of TP rank 0's store; None when tp_size is 1
    gpu_id: int = 0  # the CUDA device of this rank (unused on CPU)
    cpu_threads: int | None = None  # torch threads of this rank on a CPU; None keeps torch's default
    host_processes: int = 1  # scheduler processes on this host: on a CPU they share its cores and RAM budget
    join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S

    @property
    def is_leader(self) -> bool:
        """TP rank 0: it talks to the front end and its decisions are broadcast to the others."""
        return self.tp_rank == 0

    @property
    def tag(self) -> str:
        """SGLang's log tag: ' DP1 TP0' (each part only when that size is above 1)."""
        parts = [f"DP{self.dp_rank}"] if self.dp_size > 1 else []
        parts += [f"TP{self.tp_rank}"] if self.tp_size > 1 else []
        return "".join(f" {part}" for part in parts)

    @property
    def name(self) -> str:
        return f"TP rank {self.tp_rank}" + (f" of DP replica {self.dp_rank}" if self.dp_size > 1 else "")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def replica_addresses(args: ServerArgs) -> list[str | None]:
    """Where each replica's TP group meets (None for a group of one)."""
    if args.tp_size == 1:
        return [None] * args.dp_size
    if args.dist_init_addr is not None:
        host, port = split_host_port(args.dist_init_addr)
        return [f"{host}:{port + d}" for d in range(args.dp_size)]
    return [f"127.0.0.1:{free_port()}" for _ in range(args.dp_size)]


def local_ranks(args: ServerArgs, cpu_cores: int | None = None) -> list[RankInfo]:
    """The ranks this node runs, replica by replica; on a CPU the cores are shared out among them."""
    per_node = args.tp_ranks_per_node
    first = args.node_rank * per_node
    processes = per_node * args.dp_size
    cores = cpu_cores or os.cpu_count() or 1
    threads = None if processes == 1 else max(1, cores // processes)
    timeout = args.dist_timeout or DEFAULT_JOIN_TIMEOUT_S
    return [
        RankInfo(first + i, args.tp_size, d, args.dp_size, address, args.base_gpu_id + d * per_node + i, threads,
                 processes, timeout)
        for d, address in enumerate(replica_addresses(args)) for i in range(per_node)
    ]
