"""`toolkit serve`: start the scheduler processes, wait for the model, serve HTTP, and shut everything down on
SIGINT/SIGTERM or when a scheduler dies (then with a non-zero exit code, naming it).

One scheduler process per TP rank of every DP replica on this node (`distributed.topology`). With `--nnodes` > 1
only node 0 serves HTTP; another node runs its ranks and lives as long as they do (`run_node`).

Graceful shutdown (the first SIGTERM/SIGINT): new requests get 503, every open request ends at once (a stream
with an error event and [DONE], a plain request with 503), the scheduler aborts them all, frees their KV and
exits, and the server exits 0 within a few seconds. A second signal exits at once (128 + the signal number).

This is the HTTP process: it never imports torch or the model (the scheduler process owns them), so it starts
fast and its event loop stays light.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from toolkit.runtime.distributed.processes import RankProcesses
from toolkit.runtime.distributed.topology import RankInfo, local_ranks
from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.model_loader.fast_tokenizer import FastTokenizer
from toolkit.runtime.model_loader.tokenizer import load_fast_tokenizer
from toolkit.runtime.server.http_server import AccessLogger, build_app
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.metrics import RequestMetrics
from toolkit.runtime.server.protocol import ValidationContext
from toolkit.runtime.server.state import ServerState
from toolkit.runtime.server.tokenizer_manager import SchedulerGone, TokenizerManager
from toolkit.runtime.server.tool_calls import detect_parser, renders_tools
from toolkit.runtime.server_args import ServerArgs, default_served_model_name, parse_server_args

logger = logging.getLogger("runtime")
STARTUP_TIMEOUT = 1800.0
SHUTDOWN_GRACE = 3.0  # for the open handlers to finish, then again for the scheduler to exit
UNHEALTHY_GRACE = 1.0  # a dead scheduler keeps /health answering 503 this long before the server exits
SHUTTING_DOWN = "the server is shutting down; the request was aborted"
NODE_POLL_S = 0.2


def main(argv: list[str]) -> int:
    args = parse_server_args(argv)
    configure_logging(args.log_level, args.log_file, secrets=args.secrets)
    if args.node_rank > 0:
        return run_node(args)
    try:
        return asyncio.run(Server(args).run())
    except SchedulerGone as exc:
        logger.error(str(exc))
        return 1


def _scheduler_main(args: ServerArgs, endpoints: IpcEndpoints | None, parent_pid: int, rank: RankInfo) -> None:
    """Entry point of a spawned scheduler process: the only place the front end names the model's side."""
    from toolkit.runtime.server.scheduler_process import run_scheduler_process

    run_scheduler_process(args, endpoints, parent_pid, rank)


def start_ranks(args: ServerArgs, endpoints: list[IpcEndpoints] | None) -> RankProcesses:
    """This node's scheduler processes; each replica's TP rank 0 gets its replica's endpoints."""
    parent = os.getpid()

    def arguments(rank: RankInfo) -> tuple:
        link = endpoints[rank.dp_rank] if endpoints is not None and rank.is_leader else None
        return args, link, parent, rank

    return RankProcesses(local_ranks(args), _scheduler_main, arguments).start()


def run_node(args: ServerArgs) -> int:
    """A node other than 0 (SGLang: no HTTP server there): run this node's TP ranks until they exit; exit non-zero,
    naming the rank, when one fails, and stop them all on SIGINT/SIGTERM."""
    ranks = start_ranks(args, None)
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, _frame: stop.append(number))
    names = ", ".join(str(rank.tp_rank) for rank in ranks.ranks)
    logger.info(f"Node {args.node_rank} of {args.nnodes}: TP rank{'s' if len(ranks.ranks) > 1 else ''} {names} "
                f"join the TP group at {args.dist_init_addr}; node 0 serves HTTP")
    while ranks.any_alive() and not stop:
        failed = ranks.failed()
        if failed is not None:
            logger.error(f"{failed}; stopping this node's other ranks")
            ranks.kill()
            return 1
        time.sleep(NODE_POLL_S)
    if stop:
        logger.info(f"Received {signal.Signals(stop[0]).name}; stopping this node's ranks")
        ranks.kill()
        return 0
    failed = ranks.failed()
    if failed is not None:
        logger.error(failed)
        return 1
    logger.info("The TP group shut down; this node exits")
    return 0


def load_chat_template(tokenizer: FastTokenizer, template: str | None) -> None:
    if template is None:
        return
    path = Path(template)
    tokenizer.chat_template = path.read_text(encoding="utf-8") if path.is_file() else template


class Server:
    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.endpoints = [IpcEndpoints.fresh() for _ in range(args.dp_size)]
        self.stop: asyncio.Event | None = None  # created inside the running loop
        self.exit_code = 0
        self.ranks: RankProcesses | None = None

    async def run(self) -> int:
        self.stop = asyncio.Event()
        self._start_scheduler()
        served_name = default_served_model_name(self.args)
        manager, runner, metrics = None, None, None
        try:
            self._install_signal_handlers()
            manager = TokenizerManager(self.endpoints, None, None, self.args.stream_interval,
                                       self.args.load_balance_method, log_requests=self.args.log_requests,
                                       max_queued_requests=self.args.max_queued_requests)
            ready = await self._wait_ready(manager)
            tokenizer = load_fast_tokenizer(ready.tokenizer_folder)
            load_chat_template(tokenizer, self.args.chat_template)
            manager.tokenizer = tokenizer
            if self.args.enable_metrics:
                metrics = RequestMetrics(served_name, [r.ready.max_total_num_tokens for r in manager.replicas])
                manager.metrics = metrics
            state = ServerState(self.args, manager, ready, _validation(tokenizer, ready, self.args, served_name),
                                tokenizer, served_name, ready.tokenizer_path, metrics,
                                replicas_alive=self.ranks.replicas_alive)
            runner = await self._start_http(state)
            receiver = asyncio.ensure_future(manager.receive_forever())
            supervisor = asyncio.ensure_future(self._supervise(state, receiver))
            await self.stop.wait()
            supervisor.cancel()
            # NOTE: the receiver keeps routing scheduler output until the HTTP side has drained.
            await self._drain(state, runner)
            runner = None
            receiver.cancel()
        finally:
            await self._shutdown(manager, runner)
        return self.exit_code

    def _start_scheduler(self) -> None:
        self.ranks = start_ranks(self.args, self.endpoints)

    async def _wait_ready(self, manager: TokenizerManager):
        waiter = asyncio.ensure_future(manager.wait_ready(STARTUP_TIMEOUT))
        while not waiter.done():
            await asyncio.wait([waiter, asyncio.ensure_future(self.stop.wait())], timeout=0.5,
                               return_when=asyncio.FIRST_COMPLETED)
            if self.stop.is_set():
                waiter.cancel()
                raise SchedulerGone("interrupted while the model was loading")
            exited = self.ranks.first_exit() if not waiter.done() else None
            if exited is not None:
                waiter.cancel()
                self.ranks.kill()
                raise SchedulerGone(f"the scheduler process of {exited} while loading")
        return waiter.result()

    async def _start_http(self, state: ServerState) -> web.AppRunner:
        runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log_class=AccessLogger,
                               access_log=logger, shutdown_timeout=SHUTDOWN_GRACE)
        await runner.setup()
        await web.TCPSite(runner, self.args.host, self.args.port).start()
        logger.info(f"The server is fired up and ready to roll! Listening on http://{self.args.host}:{self.args.port}")
        return runner

    async def _supervise(self, state: ServerState, receiver: asyncio.Future) -> None:
        while (exited := self.ranks.first_exit()) is None and not receiver.done():
            await asyncio.sleep(0.2)
        if receiver.done():
            logger.error(f"reading the scheduler's output failed: {receiver.exception()!r}")
        else:
            logger.error("Received sigquit from a child process. It usually means the child failed. "
                         f"(the scheduler process of {exited})")
        state.healthy = False
        state.manager.fail_all("the scheduler process died")
        self.exit_code = 1
        await asyncio.sleep(UNHEALTHY_GRACE)
        self.stop.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        name = signal.Signals(sig).name
        if self.stop.is_set():
            logger.warning(f"Received {name} again; exiting now")
            self._exit_now(128 + sig)
        logger.info(f"Received {name}; shutting down")
        self.stop.set()

    def _exit_now(self, code: int) -> None:
        if self.ranks is not None:
            self.ranks.kill(grace=0.5)
        self._cleanup_endpoints()
        logging.shutdown()
        os._exit(code)

    async def _drain(self, state: ServerState, runner: web.AppRunner) -> None:
        """Refuse new requests, end the open ones, let their handlers write their last bytes, stop the scheduler."""
        state.draining = True
        aborted = state.manager.shutdown(SHUTTING_DOWN)
        logger.info(f"Shutting down: new requests get 503, aborted {aborted} requests")
        await runner.cleanup()
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while self.ranks.any_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _shutdown(self, manager: TokenizerManager | None, runner: web.AppRunner | None) -> None:
        if runner is not None:
            await runner.cleanup()
        if manager is not None:
            manager.close()
        if self.ranks is not None:
            # NOTE: _drain has already given them SHUTDOWN_GRACE to exit
            if not self.ranks.join(0.1):
                logger.warning("a scheduler process did not exit in time; killing it")
                self.ranks.kill(SHUTDOWN_GRACE)
        self._cleanup_endpoints()

    def _cleanup_endpoints(self) -> None:
        for endpoints in self.endpoints:
            endpoints.cleanup()


def _validation(tokenizer: FastTokenizer, ready, args: ServerArgs, served_name: str) -> ValidationContext:
    def encode_chat(messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, tools=tools)

    template = tokenizer.default_chat_template

    return ValidationContext(
        served_model_name=served_name, context_len=ready.context_len, vocab_size=ready.vocab_size,
        allow_auto_truncate=args.allow_auto_truncate, encode=tokenizer.encode, encode_chat=encode_chat,
        max_token_chars=max(map(len, tokenizer.backend.get_vocab(with_added_tokens=True)), default=0),
        constrained=args.grammar_backend != "none",
        tool_parser=args.tool_call_parser or detect_parser(template), native_tools=renders_tools(template),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
