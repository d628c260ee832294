"""The scheduler processes one node runs (one per local TP rank of every DP replica) and their supervision: the
first to exit is named, and the rest can be stopped, so no rank outlives its server. Torch-free."""
from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from toolkit.runtime.distributed.topology import RankInfo


class RankProcesses:
    """`target(*args_of(rank))` in a spawned process per rank, in the order of `ranks`."""

    def __init__(self, ranks: list[RankInfo], target: Callable, args_of: Callable[[RankInfo], tuple]) -> None:
        context = multiprocessing.get_context("spawn")
        self.ranks = list(ranks)
        self.processes: list[BaseProcess] = [
            context.Process(target=target, name=f"toolkit-scheduler{rank.tag.replace(' ', '-')}", args=args_of(rank),
                            daemon=True)
            for rank in self.ranks
        ]

    def start(self) -> RankProcesses:
        for process in self.processes:
            process.start()
        return self

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self.processes]

    def any_alive(self) -> bool:
        return any(process.is_alive() for process in self.processes)

    def replicas_alive(self) -> list[bool]:
        """Per DP replica: every one of its ranks on this node runs."""
        alive: dict[int, bool] = {}
        for rank, process in zip(self.ranks, self.processes):
            alive[rank.dp_rank] = alive.get(rank.dp_rank, True) and process.is_alive()
        return [alive[d] for d in sorted(alive)]

    def exited(self) -> list[tuple[RankInfo, BaseProcess]]:
        return [(rank, process) for rank, process in zip(self.ranks, self.processes) if not process.is_alive()]

    def first_exit(self) -> str | None:
        """Which rank exited, in words, or None while all run. A rank killed by a signal is named before one that
        exited by itself (the others exit 1 once they lose it)."""
        exited = self.exited()
        if not exited:
            return None
        rank, process = min(exited, key=lambda item: (item[1].exitcode or 0) >= 0)
        return describe_exit(rank, process)

    def failed(self) -> str | None:
        """The first rank that exited non-zero, in words, or None."""
        failures = [(rank, p) for rank, p in self.exited() if p.exitcode != 0]
        if not failures:
            return None
        rank, process = min(failures, key=lambda item: (item[1].exitcode or 0) >= 0)
        return describe_exit(rank, process)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for every process to exit; True when none is left."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        return not self.any_alive()

    def kill(self, grace: float = 3.0) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        self.join(grace)


def describe_exit(rank: RankInfo, process: BaseProcess) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    return f"{rank.name} (pid {process.pid}) {how}"
