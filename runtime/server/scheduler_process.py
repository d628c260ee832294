"""The scheduler process: owns the model (or, under TP, one rank's shard of it), runs `Scheduler.step()` in a loop,
talks to the front end over ZMQ.

Under tensor parallelism every rank runs this loop with the same scheduler (SGLang's design): TP rank 0, the leader,
receives the front end's messages and broadcasts each iteration's list to the others over the group's host channel;
every rank applies the list and runs `step()`, and the scheduler being deterministic given its inputs, every rank
takes the same decisions and runs the same batches. Only the leader answers the front end.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import traceback

import zmq

from toolkit.runtime.io_struct import (
    BatchOutput,
    GenerateInput,
    SchedulerFailed,
    SchedulerReady,
    ShutdownRequest,
    TokenOutput,
)
from toolkit.runtime.distributed.group import DistributedError, TPGroup
from toolkit.runtime.distributed.topology import RankInfo
from toolkit.runtime.launch import launch_scheduler
from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.cpu_capability import UnsupportedCpu
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.tokenizer import prepare_tokenizer_folder
from toolkit.runtime.scheduler.scheduler import Scheduler
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.watchdog import Watchdog
from toolkit.runtime.server_args import SECRET_FIELDS, ServerArgs, redacted

logger = logging.getLogger("runtime")
IDLE_POLL_MS = 500  # how long an idle scheduler sleeps in recv before checking that its parent lives


def run_scheduler_process(args: ServerArgs, endpoints: IpcEndpoints | None, parent_pid: int,
                          rank: RankInfo | None = None) -> None:
    """Entry point of the spawned process. `endpoints` is the leader's link to the front end (None for the other
    TP ranks)."""
    # NOTE: Ctrl-C (and a SIGTERM to the process group) reach the scheduler too; the front end decides when it
    # stops (a ShutdownRequest), and it exits by itself when the front end is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = rank or RankInfo(gpu_id=args.base_gpu_id)
    configure_logging(args.log_level, args.log_file, rank_tag=rank.tag, secrets=args.secrets)
    context = zmq.Context(1)
    inbox = outbox = None
    if endpoints is not None:
        inbox = context.socket(zmq.PULL)
        inbox.connect(endpoints.to_scheduler)
        outbox = context.socket(zmq.PUSH)
        outbox.connect(endpoints.from_scheduler)
    try:
        launched = launch_scheduler(args, rank=rank, exit_on_silence=True)
        if outbox is not None:
            outbox.send_pyobj(_ready_message(launched))
        SchedulerLoop(launched.scheduler, inbox, outbox, parent_pid, launched.tp).run()
        if launched.tp is not None:
            launched.tp.close()
    except (ModelLoadError, DistributedError, UnsupportedCpu) as exc:
        _fail(str(exc), str(exc), outbox, context, rank)
    except Exception:
        message = traceback.format_exc()
        _fail(f"Scheduler hit an exception: {message}", message, outbox, context, rank)
    finally:
        context.destroy(linger=200)


def _fail(log_line: str, report: str, outbox: zmq.Socket | None, context: zmq.Context, rank: RankInfo) -> None:
    logger.error(log_line)
    if outbox is not None:
        outbox.send_pyobj(SchedulerFailed(report))
    if rank.tp_size == 1:
        raise SystemExit(1)
    # NOTE: a rank of a TP group exits at once: draining or leaving the group would wait on a rank that is gone.
    context.destroy(linger=200)
    for handler in logger.handlers:
        handler.flush()
    os._exit(1)


def _ready_message(launched) -> SchedulerReady:
    scheduler, runner = launched.scheduler, launched.runner
    server_args = dataclasses.asdict(launched.args)
    server_args.update({name: redacted(server_args[name]) for name in SECRET_FIELDS})
    return SchedulerReady(
        server_args=server_args,
        context_len=scheduler.context_len,
        max_total_num_tokens=scheduler.max_total_num_tokens,
        max_running_requests=scheduler.max_running_requests,
        vocab_size=runner.config.vocab_size,
        model_class=runner.config.architecture,
        attention_backend=runner.attention_backend_name,
        tokenizer_path=str(launched.source.tokenizer_path),
        tokenizer_folder=str(prepare_tokenizer_folder(launched.source.tokenizer_path)),
    )


class SchedulerLoop:
    """One rank's loop. The leader (with `inbox`/`outbox`) reads the front end; under TP (`tp`) each iteration's
    messages are the leader's, shared with every rank before any rank applies them."""

    def __init__(self, scheduler: Scheduler, inbox: zmq.Socket | None, outbox: zmq.Socket | None, parent_pid: int,
                 tp: TPGroup | None = None) -> None:
        self.scheduler = scheduler
        self.inbox = inbox
        self.outbox = outbox
        self.parent_pid = parent_pid
        self.tp = tp
        self.is_leader = inbox is not None
        self.watchdog = Watchdog(scheduler.args.watchdog_timeout, self._describe_batch)
        self.shutting_down = False
        self.aborted_at_shutdown = 0
        self.live_rids: set[str] = set()  # received and not finished yet

    def run(self) -> None:
        if self.is_leader:
            # NOTE: the front end's counters exist from the first moment /get_server_info can be asked.
            self.outbox.send_pyobj(self._batch_output([]))
        try:
            self._loop()
        except BaseException:
            if self.tp is None:  # NOTE: a TP rank never drains after a failure: the step may wait on a lost rank
                self.scheduler.shutdown()
            raise
        self.scheduler.shutdown()

    def _batch_output(self, outputs: list[TokenOutput]) -> BatchOutput:
        # NOTE: a copy: the scheduler keeps updating its own counters while the message waits to be sent.
        return BatchOutput(outputs, dataclasses.replace(self.scheduler.stats))

    def _loop(self) -> None:
        pending: list[object] = []
        while True:
            messages = pending + self._receive(block=not self.scheduler.has_work)
            pending = []
            if self.tp is not None:
                messages = self.tp.share(messages)
            for message in messages:
                self._handle(message)
            with self.watchdog.armed():
                outputs = self.scheduler.step()
            if self.is_leader:
                self.outbox.send_pyobj(self._batch_output(outputs), copy=False)
            self.live_rids.difference_update(o.rid for o in outputs if o.finished_reason is not None)
            if self.shutting_down and not self.scheduler.has_work:
                self._report_shutdown()
                return
            if not self.shutting_down and os.getppid() != self.parent_pid:
                if not self.is_leader:  # NOTE: its node's launcher is gone: the node is, and the group fails
                    raise DistributedError(f"the process that started this rank (pid {self.parent_pid}) is gone")
                # NOTE: a shutdown every rank applies, so a TP group stops together.
                logger.info("the front end is gone; the scheduler exits")
                pending.append(ShutdownRequest())

    def _receive(self, block: bool) -> list[object]:
        if not self.is_leader or (block and not self.inbox.poll(IDLE_POLL_MS)):
            return []
        messages = []
        while True:
            try:
                messages.append(self.inbox.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return messages

    def _handle(self, message: object) -> None:
        if isinstance(message, GenerateInput):
            self.live_rids.add(message.rid)
        if isinstance(message, ShutdownRequest):
            if not self.shutting_down:
                self.shutting_down = True
                self.aborted_at_shutdown = self._abort_everything("the server is shutting down")
            return
        result = self.scheduler.handle(message)
        if result is not None and self.is_leader:
            self.outbox.send_pyobj(result)

    def _abort_everything(self, message: str) -> int:
        """Abort every request not finished yet; the next steps free their KV."""
        for rid in self.live_rids:
            self.scheduler.abort_request(rid, message)
        return len(self.live_rids)

    def _report_shutdown(self) -> None:
        pool_free = self.scheduler.check_memory()
        logger.info(f"Scheduler shut down: aborted {self.aborted_at_shutdown} requests, KV pool free: {pool_free}")

    def _describe_batch(self) -> str:
        scheduler = self.scheduler
        return (f"running={[r.rid for r in scheduler.running.reqs][:16]}, waiting={len(scheduler.waiting)}, "
                f"chunked={scheduler.chunked_req.rid if scheduler.chunked_req else None}")
