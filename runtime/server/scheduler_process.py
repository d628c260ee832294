"""The scheduler process: owns the model, runs `Scheduler.step()` in a loop, talks to the front end over ZMQ."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import traceback

import zmq

from toolkit.runtime.io_struct import (
    AbortRequest,
    BatchOutput,
    FlushCacheRequest,
    FlushCacheResult,
    GenerateInput,
    SchedulerFailed,
    SchedulerReady,
    ShutdownRequest,
)
from toolkit.runtime.launch import launch_scheduler
from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.tokenizer import prepare_tokenizer_folder
from toolkit.runtime.scheduler.scheduler import Scheduler
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.watchdog import Watchdog
from toolkit.runtime.server_args import SECRET_FIELDS, ServerArgs, redacted

logger = logging.getLogger("runtime")
IDLE_POLL_MS = 500  # how long an idle scheduler sleeps in recv before checking that its parent lives


def run_scheduler_process(args: ServerArgs, endpoints: IpcEndpoints, parent_pid: int) -> None:
    """Entry point of the spawned process."""
    # NOTE: Ctrl-C (and a SIGTERM to the process group) reach the scheduler too; the front end decides when it
    # stops (a ShutdownRequest), and it exits by itself when the front end is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(args.log_level, args.log_file, secrets=args.secrets)
    context = zmq.Context(1)
    inbox = context.socket(zmq.PULL)
    inbox.connect(endpoints.to_scheduler)
    outbox = context.socket(zmq.PUSH)
    outbox.connect(endpoints.from_scheduler)
    try:
        launched = launch_scheduler(args, shares_cores=True)
        outbox.send_pyobj(_ready_message(launched))
        SchedulerLoop(launched.scheduler, inbox, outbox, parent_pid).run()
    except ModelLoadError as exc:
        logger.error(str(exc))
        outbox.send_pyobj(SchedulerFailed(str(exc)))
        raise SystemExit(1) from None
    except Exception:
        message = traceback.format_exc()
        logger.error(f"Scheduler hit an exception: {message}")
        outbox.send_pyobj(SchedulerFailed(message))
        raise SystemExit(1) from None
    finally:
        context.destroy(linger=200)


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
    def __init__(self, scheduler: Scheduler, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int) -> None:
        self.scheduler = scheduler
        self.inbox = inbox
        self.outbox = outbox
        self.parent_pid = parent_pid
        self.watchdog = Watchdog(scheduler.args.watchdog_timeout, self._describe_batch)
        self.running = True
        self.shutting_down = False
        self.aborted_at_shutdown = 0
        self.live_rids: set[str] = set()  # received and not finished yet

    def run(self) -> None:
        # NOTE: the front end's counters exist from the first moment /get_server_info can be asked.
        self.outbox.send_pyobj(BatchOutput([], self.scheduler.stats.as_dict()))
        try:
            self._loop()
        finally:
            self.scheduler.shutdown()

    def _loop(self) -> None:
        while self.running:
            self._receive(block=not self.scheduler.has_work)
            if not self.running:
                break
            with self.watchdog.armed():
                outputs = self.scheduler.step()
            stats = self.scheduler.stats.as_dict()
            self.outbox.send_pyobj(BatchOutput(outputs, stats), copy=False)
            self.live_rids.difference_update(o.rid for o in outputs if o.finished_reason is not None)
            if self.shutting_down and not self.scheduler.has_work:
                self._report_shutdown()
                return
            if not _alive(self.parent_pid):
                logger.info("the front end is gone; the scheduler exits")
                return

    def _receive(self, block: bool) -> None:
        if block and not self.inbox.poll(IDLE_POLL_MS):
            return
        while True:
            try:
                message = self.inbox.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(message)

    def _handle(self, message: object) -> None:
        if isinstance(message, GenerateInput):
            self.live_rids.add(message.rid)
            self.scheduler.add_request(message)
        elif isinstance(message, AbortRequest):
            self.scheduler.abort_request(message.rid)
        elif isinstance(message, FlushCacheRequest):
            self.outbox.send_pyobj(FlushCacheResult(self.scheduler.flush_cache()))
        elif isinstance(message, ShutdownRequest) and not self.shutting_down:
            self.shutting_down = True
            self.aborted_at_shutdown = self._abort_everything("the server is shutting down")

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
