"""One tensor-parallel group (SGLang's `parallel_state`): the collectives the sharded model runs on its device
(all-reduce after row-parallel layers, all-gather of vocab-parallel logits, rank 0's sampled tokens) and the
control channel on the host (rank 0's received messages, once per loop iteration, over gloo as SGLang's cpu group).

Joining is bounded: TP rank 0 hosts a TCPStore at the group's address and every rank waits at most the join
timeout for the others, then names the ranks that never came. Once joined, every rank beats a counter in the store.
When a collective fails (gloo raises as soon as a peer's connection closes) the error names the rank whose beat
stopped, or rank 0 when its store is gone; in a scheduler process a watcher thread also ends a rank whose peer has
been silent for PEER_SILENCE_S (a frozen process or a lost node), so no rank waits forever.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from toolkit.runtime.distributed.topology import RankInfo
from toolkit.runtime.server_args import split_host_port

logger = logging.getLogger("runtime")

BEAT_S = 0.25
PEER_SILENCE_S = 30.0
EXPLAIN_WAIT_S = 2.0  # how long a failed collective watches the beats to tell which rank is gone
CONTROL_TIMEOUT = timedelta(days=30)  # rank 0 may idle (an offline Engine between calls); deaths are seen anyway
POLL_S = 0.05


class DistributedError(RuntimeError):
    """A rank of the TP group is gone or never came; the message names it and the group's address."""


class TPGroup:
    """This process's rank of one TP group. `peers_dead` (optional) says which local rank process has died, so a
    join fails at once instead of waiting out the timeout."""

    def __init__(self, info: RankInfo, device: torch.device, op_timeout_s: float,
                 peers_dead: Callable[[], str | None] | None = None, exit_on_silence: bool = False) -> None:
        assert info.init_addr is not None and info.tp_size > 1
        self.info = info
        self.rank, self.size, self.address = info.tp_rank, info.tp_size, info.init_addr
        self.is_leader = info.is_leader
        self.device = device
        host, port = split_host_port(info.init_addr)
        self.store = _open_store(host, port, info)
        _join(self.store, info, peers_dead)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("toolkit", self.store), rank=self.rank,
                                world_size=self.size, timeout=timedelta(seconds=op_timeout_s),
                                device_id=device if device.type == "cuda" else None)
        self.control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        self.watch = PeerWatch(host, port, info, exit_on_silence)
        logger.info(f"Joined the TP group at {self.address}: rank {self.rank} of {self.size} (pid {os.getpid()}), "
                    f"backend {backend}")

    # ---- on the forward thread: the model's collectives, every rank in the same order ----
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place."""
        self._checked(dist.all_reduce, x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x side by side along the last dim: [rows, size * cols]."""
        x = x.contiguous()
        if x.is_cuda:
            gathered = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
            self._checked(dist.all_gather_into_tensor, gathered, x)
            return gathered.movedim(0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._checked(dist.all_gather, parts, x)
        return torch.cat(parts, dim=-1)

    def broadcast_tokens(self, tokens: torch.Tensor | None, rows: int) -> torch.Tensor:
        """Rank 0's sampled token ids on every rank (the others pass None)."""
        if tokens is None:
            tokens = torch.empty(rows, dtype=torch.int64, device=self.device)
        self._checked(dist.broadcast, tokens, 0)
        return tokens

    # ---- on the scheduler thread: control, over the host group ----
    def share(self, messages: list[object]) -> list[object]:
        """Rank 0's messages of this loop iteration, on every rank (the others pass an empty list)."""
        box = [messages if self.is_leader else None]
        self._checked(dist.broadcast_object_list, box, 0, group=self.control)
        return box[0]

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        self._checked(dist.all_reduce, t, dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def close(self) -> None:
        """Leave together: no rank's watcher may see a peer that left normally as lost."""
        self.watch.stop()
        try:
            dist.barrier(group=self.control)
        except RuntimeError:
            pass
        dist.destroy_process_group()

    def abandon(self) -> None:
        """Leave a group that lost a rank (no barrier: it would wait on the lost rank)."""
        self.watch.stop()
        dist.destroy_process_group()

    def _checked(self, op: Callable, *args, **kwargs) -> None:
        try:
            op(*args, **kwargs)
        except RuntimeError as exc:
            raise DistributedError(self.explain(exc)) from None

    def explain(self, exc: BaseException) -> str:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        lost = self.watch.find_lost(EXPLAIN_WAIT_S)
        return f"{self.info.name}: lost {lost} of the TP group at {self.address} ({reason})"


def _open_store(host: str, port: int, info: RankInfo) -> dist.TCPStore:
    timeout = timedelta(seconds=info.join_timeout_s)
    if info.is_leader:
        try:
            return dist.TCPStore(host, port, info.tp_size, is_master=True, wait_for_workers=False, timeout=timeout)
        except RuntimeError as exc:
            raise DistributedError(f"TP rank 0 cannot listen at {host}:{port} for the TP group: {exc}") from None
    # NOTE: wait for the port quietly; TCPStore's own retries print a C++ stack trace per attempt.
    deadline = time.monotonic() + info.join_timeout_s
    while not _reachable(host, port):
        if time.monotonic() > deadline:
            raise DistributedError(f"{info.name} could not reach TP rank 0 at {host}:{port} within "
                                   f"{info.join_timeout_s} s (is node 0's `toolkit serve` running with the same "
                                   "--dist-init-addr?)")
        time.sleep(0.2)
    try:
        return dist.TCPStore(host, port, info.tp_size, is_master=False, timeout=timeout)
    except RuntimeError as exc:
        raise DistributedError(f"{info.name} could not join TP rank 0 at {host}:{port}: {exc}") from None


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _join(store: dist.TCPStore, info: RankInfo, peers_dead: Callable[[], str | None] | None) -> None:
    """Every rank announces itself and waits until all have (so the process group's own setup cannot hang)."""
    address = info.init_addr
    try:
        store.set(f"joined/{info.tp_rank}", f"{socket.gethostname()}:{os.getpid()}")
        deadline = time.monotonic() + info.join_timeout_s
        while missing := [r for r in range(info.tp_size) if not store.check([f"joined/{r}"])]:
            dead = peers_dead() if peers_dead is not None else None
            if dead:
                raise DistributedError(f"{dead} before joining the TP group at {address}")
            if time.monotonic() > deadline:
                ranks = ", ".join(map(str, missing))
                raise DistributedError(
                    f"TP rank{'s' if len(missing) > 1 else ''} {ranks} did not join the TP group at {address} within "
                    f"{info.join_timeout_s} s (start every node's `toolkit serve --node-rank N` with the same "
                    "--dist-init-addr, or raise --dist-timeout)")
            time.sleep(POLL_S)
    except DistributedError:
        raise
    except RuntimeError as exc:
        raise DistributedError(f"{info.name}: lost TP rank 0 at {address} while joining ({exc})") from None


class PeerWatch:
    """Every rank's heartbeat counter in the group's store, over a connection of its own."""

    def __init__(self, host: str, port: int, info: RankInfo, exit_on_silence: bool) -> None:
        self.info = info
        self.store = dist.TCPStore(host, port, info.tp_size, is_master=False, timeout=timedelta(seconds=10))
        # NOTE: the scheduler thread reads the beats over a connection of its own (the heartbeat thread owns one).
        self.reader = dist.TCPStore(host, port, info.tp_size, is_master=False, timeout=timedelta(seconds=2))
        self.exit_on_silence = exit_on_silence
        self._beats = [-1] * info.tp_size
        self._changed = [time.monotonic()] * info.tp_size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolkit-tp-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            lost = self._beat()
            if lost is not None and self.exit_on_silence and not self._stop.is_set():
                logger.error(f"{self.info.name}: {lost} of the TP group at {self.info.init_addr}; exiting")
                for handler in logger.handlers:
                    handler.flush()
                os._exit(1)

    def _beat(self) -> str | None:
        """One heartbeat; what is lost, if anything (a rank silent for PEER_SILENCE_S, or the store)."""
        now = time.monotonic()
        try:
            self.store.add(f"beat/{self.info.tp_rank}", 1)
            beats = [int(self.store.add(f"beat/{r}", 0)) for r in range(self.info.tp_size)]
        except RuntimeError:
            return "lost TP rank 0 (its store does not answer)"
        for r, beat in enumerate(beats):
            if beat != self._beats[r]:
                self._beats[r], self._changed[r] = beat, now
        silent = [r for r in range(self.info.tp_size) if now - self._changed[r] > PEER_SILENCE_S]
        return f"lost TP rank {silent[0]} (silent for {PEER_SILENCE_S:.0f} s)" if silent else None

    def find_lost(self, wait_s: float) -> str:
        """Which rank is gone: rank 0 when its store does not answer, else the ranks whose beat stood still for
        `wait_s` (a live rank beats every BEAT_S)."""
        first = self._snapshot()
        if first is not None:
            time.sleep(wait_s)
            last = self._snapshot()
            if last is not None:
                still = [r for r in range(self.info.tp_size) if r != self.info.tp_rank and last[r] == first[r]]
                return "TP rank " + ", ".join(map(str, still)) if still else "a peer"
        return "TP rank 0 (the group's store does not answer)"

    def _snapshot(self) -> list[int] | None:
        try:
            return [int(self.reader.add(f"beat/{r}", 0)) for r in range(self.info.tp_size)]
        except RuntimeError:
            return None
