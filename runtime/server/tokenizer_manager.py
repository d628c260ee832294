"""The front end's side of generation: submits tokenized requests to the scheduler process, routes its
per-step outputs back to each waiting HTTP handler, detokenizes incrementally, aborts on disconnect.

With `--dp-size N` it holds one ZMQ pair per replica (each replica's TP rank 0): a new request goes to the replica
`--load-balance-method` picks, and its abort to the replica that holds it."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from toolkit.runtime.io_struct import (
    INVALID_GRAMMAR,
    WAITING_TIMEOUT,
    AbortRequest,
    BatchOutput,
    FinishReason,
    FlushCacheRequest,
    FlushCacheResult,
    GenerateInput,
    LogprobEntry,
    SchedulerFailed,
    SchedulerReady,
    SchedulerStats,
    ShutdownRequest,
    TokenOutput,
)
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server.admission import Overloaded, ShedLog, ShedReason, over_limit, queue_full_message, queued
from toolkit.runtime.server.detokenizer import IncrementalDetokenizer
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.load_balance import LoadBalancer, ReplicaLoad
from toolkit.runtime.server.metrics import RequestMetrics

logger = logging.getLogger("runtime")


@dataclass
class Chunk:
    """What a handler receives per scheduler step: new text, new tokens, and the finish if it came."""

    text: str
    token_ids: list[int]
    logprobs: list[tuple[int, float, list[tuple[int, float]] | None]]
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompt_logprobs: list[LogprobEntry] | None = None  # with the first token, when the prompt's were asked


@dataclass
class _RequestState:
    rid: str
    detokenizer: IncrementalDetokenizer
    queue: asyncio.Queue
    stream_interval: int
    created: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    pending: list[TokenOutput] = field(default_factory=list)
    finished: bool = False
    replica: int = 0
    tokens: int = 0  # what it counts for in its replica's load (prompt + max_new_tokens)
    logged_text: list[str] | None = None  # the output so far, kept only with --log-requests


class Replica:
    """One DP replica as the front end sees it: its ZMQ pair, what it reported, the load sent to it."""

    def __init__(self, dp_rank: int, endpoints: IpcEndpoints, context: zmq.asyncio.Context) -> None:
        self.dp_rank = dp_rank
        # NOTE: a plain (blocking-API) socket over the same context: with NOBLOCK a send either queues at once or
        # raises zmq.Again here (no peer: the scheduler is gone), never a Future whose error nobody retrieves.
        self.to_scheduler = zmq.Context.shadow(context.underlying).socket(zmq.PUSH)
        self.to_scheduler.setsockopt(zmq.SNDHWM, 0)
        self.to_scheduler.bind(endpoints.to_scheduler)
        self.from_scheduler = context.socket(zmq.PULL)
        self.from_scheduler.bind(endpoints.from_scheduler)
        self.ready: SchedulerReady | None = None
        self.stats = SchedulerStats()  # NOTE: zeros until the replica's first BatchOutput
        self.load = ReplicaLoad()

    def send(self, message: object) -> bool:
        """Queue a message for the replica; False when it cannot take one (it is gone)."""
        try:
            self.to_scheduler.send_pyobj(message, zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def close(self) -> None:
        self.to_scheduler.close(linger=100)


class SchedulerGone(RuntimeError):
    """The scheduler cannot serve the request: it died, or the server is shutting down. The message is for
    clients (a sentence, never a traceback)."""


SCHEDULER_FAILED = "the scheduler process failed; the error is in the server log"


class GrammarRejected(ValueError):
    """The scheduler refused the request's grammar (invalid, too slow to compile, or constrained decoding off): the
    request's fault, answered 400 naming the field that carried the grammar."""


class TokenizerManager:
    def __init__(self, endpoints: IpcEndpoints | list[IpcEndpoints], tokenizer, metrics: RequestMetrics | None,
                 stream_interval: int, load_balance_method: str = "round_robin", log_requests: bool = False,
                 max_queued_requests: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_queued_requests = max_queued_requests
        self.shed_log = ShedLog()
        self.log_requests = log_requests
        self.metrics = metrics
        self.stream_interval = stream_interval
        self.context = zmq.asyncio.Context(1)
        endpoints = [endpoints] if isinstance(endpoints, IpcEndpoints) else list(endpoints)
        self.replicas = [Replica(d, e, self.context) for d, e in enumerate(endpoints)]
        self.balancer = LoadBalancer(load_balance_method, len(self.replicas))
        self.states: dict[str, _RequestState] = {}
        self.failure: str | None = None  # why requests are refused, in words for clients
        self.failure_detail: str | None = None  # the scheduler's own report (a traceback), for the log
        self._flush_waiters: list[tuple[asyncio.Future, dict[int, bool]]] = []

    @property
    def ready(self) -> SchedulerReady | None:
        """Replica 0's report once every replica is ready (they serve the same model)."""
        return self.replicas[0].ready if all(r.ready is not None for r in self.replicas) else None

    @property
    def stats(self) -> SchedulerStats:
        return self.replicas[0].stats

    # ---- lifecycle ----
    async def wait_ready(self, timeout: float) -> SchedulerReady:
        deadline = time.monotonic() + timeout
        poller = zmq.asyncio.Poller()
        for replica in self.replicas:
            poller.register(replica.from_scheduler, zmq.POLLIN)
        while self.ready is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SchedulerGone(f"the scheduler was not ready within {timeout:.0f} s")
            for socket, _ in await poller.poll(int(min(remaining, 1.0) * 1000)):
                replica = next(r for r in self.replicas if r.from_scheduler is socket)
                self._dispatch(await socket.recv_pyobj(), replica.dp_rank)
            if self.failure:
                raise SchedulerGone(f"the scheduler failed to start:\n{self.failure_detail or self.failure}")
        return self.ready

    async def receive_forever(self) -> None:
        await asyncio.gather(*(self._receive(replica) for replica in self.replicas))

    async def _receive(self, replica: Replica) -> None:
        while True:
            self._dispatch(await replica.from_scheduler.recv_pyobj(), replica.dp_rank)

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
        self.context.destroy(linger=100)

    def fail_all(self, message: str) -> int:
        """Finish every waiting request with SchedulerGone(message) and refuse new ones; returns how many."""
        self.failure = message
        states = list(self.states.values())
        for state in states:
            self._close(state)
            state.queue.put_nowait(SchedulerGone(message))
            if self.metrics:
                self.metrics.on_abort(state.replica)
        return len(states)

    def shutdown(self, message: str) -> int:
        """Graceful stop: end every open request now, then ask the scheduler to abort them all, free their KV
        and exit. Returns how many requests were open."""
        aborted = self.fail_all(message)
        for replica in self.replicas:
            replica.send(ShutdownRequest())
        return aborted

    # ---- requests ----
    @property
    def waiting_requests(self) -> int:
        """The requests waiting to be scheduled, over every replica, as the front end sees them (`admission`)."""
        return sum(queued(r.load.open_requests, r.stats.num_running_reqs) for r in self.replicas)

    def admit(self, sequences: int) -> None:
        """Raise Overloaded when `sequences` more requests would make the waiting queue exceed
        --max-queued-requests; call it before submitting any of them."""
        waiting = self.waiting_requests
        if over_limit(waiting, sequences, self.max_queued_requests, len(self.replicas)):
            for _ in range(sequences):
                self._shed("queue_full")
            raise Overloaded("queue_full", queue_full_message(self.max_queued_requests, waiting))

    def _shed(self, reason: ShedReason, dp_rank: int | None = None) -> None:
        self.shed_log.count(reason)
        if self.metrics:
            self.metrics.on_queue_rejected(reason, dp_rank)

    def generate(self, input_ids: list[int], params: SamplingParams, return_logprob: bool = False,
                 top_logprobs_num: int = 0, stream: bool = False, rid: str | None = None,
                 logprob_start_len: int = -1) -> AsyncIterator[Chunk]:
        """Submit one generation; iterate its chunks (one per `stream_interval` tokens when streaming)."""
        if self.failure is not None:
            raise SchedulerGone(self.failure)
        rid = rid or uuid.uuid4().hex
        replica = self.replicas[self.balancer.choose([r.load for r in self.replicas])]
        if not replica.send(GenerateInput(rid, input_ids, params, return_logprob, top_logprobs_num, logprob_start_len)):
            raise SchedulerGone("the scheduler process is not accepting requests")
        state = _RequestState(
            rid, IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop), asyncio.Queue(),
            self.stream_interval if stream else 1 << 30, replica=replica.dp_rank,
            tokens=len(input_ids) + params.max_new_tokens,
        )
        if self.log_requests:
            state.logged_text = []
            logger.info(f"Receive: rid={rid}, input_ids={input_ids}, sampling_params={params}")
        self.states[rid] = state
        replica.load.open_requests += 1
        replica.load.open_tokens += state.tokens
        return self._chunks(state)

    def _close(self, state: _RequestState) -> None:
        """The request is over for the front end: it leaves its replica's load."""
        state.finished = True
        self.states.pop(state.rid, None)
        load = self.replicas[state.replica].load
        load.open_requests -= 1
        load.open_tokens -= state.tokens

    async def _chunks(self, state: _RequestState) -> AsyncIterator[Chunk]:
        try:
            while True:
                item = await state.queue.get()
                if isinstance(item, Exception):
                    raise item
                reason = item.finished_reason
                if reason is not None and reason.code == WAITING_TIMEOUT:
                    raise Overloaded("waiting_timeout", reason.message or "the request waited too long in the queue")
                if reason is not None and reason.code == INVALID_GRAMMAR:
                    raise GrammarRejected(reason.message or "the grammar was refused")
                yield item
                if item.finished_reason is not None:
                    return
        finally:
            if not state.finished:
                self.abort(state.rid)

    def abort(self, rid: str) -> None:
        state = self.states.get(rid)
        if state is None:
            return
        self._close(state)
        if self.metrics:
            self.metrics.on_abort(state.replica)
        self.replicas[state.replica].send(AbortRequest(rid))

    async def flush_cache(self, timeout: float = 10.0) -> bool:
        """Every replica flushes (each only when idle); True when all did."""
        if self.failure is not None or not all(r.send(FlushCacheRequest()) for r in self.replicas):
            raise SchedulerGone(self.failure or "the scheduler process is not accepting requests")
        future = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((future, {}))
        return await asyncio.wait_for(future, timeout)

    # ---- outputs ----
    def _dispatch(self, message: object, dp_rank: int = 0) -> None:
        replica = self.replicas[dp_rank]
        if isinstance(message, BatchOutput):
            self.shed_log.flush()
            replica.stats = message.stats
            if self.metrics:
                self.metrics.on_scheduler_stats(message.stats, dp_rank)
            for output in message.outputs:
                self._route(output)
        elif isinstance(message, SchedulerReady):
            replica.ready = message
        elif isinstance(message, FlushCacheResult):
            self._flush_answered(dp_rank, message.ok)
        elif isinstance(message, SchedulerFailed):
            self.failure_detail = message.message
            self.fail_all(SCHEDULER_FAILED)

    def _flush_answered(self, dp_rank: int, ok: bool) -> None:
        """A replica's answer goes to the oldest flush it has not answered yet."""
        for future, answers in self._flush_waiters:
            if dp_rank not in answers:
                answers[dp_rank] = ok
                if len(answers) == len(self.replicas) and not future.done():
                    future.set_result(all(answers.values()))
                break
        self._flush_waiters = [(f, a) for f, a in self._flush_waiters if len(a) < len(self.replicas)]

    def _fail(self, state: _RequestState) -> None:
        """Delivering this request's output failed: its handler gets the error (even when the failure came after
        the request was closed), the scheduler an abort."""
        if not state.finished:
            self._close(state)
        state.queue.put_nowait(RuntimeError(f"delivering the output of request {state.rid} failed"))
        self.replicas[state.replica].send(AbortRequest(state.rid))

    def _route(self, output: TokenOutput) -> None:
        state = self.states.get(output.rid)
        if state is None:
            return
        try:
            self._deliver(state, output)
        except Exception:  # NOTE: one request's failure must not stall every other request's output
            logger.exception(f"failed to deliver the output of request {output.rid}")
            self._fail(state)

    def _deliver(self, state: _RequestState, output: TokenOutput) -> None:
        now = time.perf_counter()
        if output.token_id is not None:
            self._time_token(state, now)
        state.pending.append(output)
        if output.finished_reason is not None or len(state.pending) >= state.stream_interval:
            self._flush(state, now)

    def _time_token(self, state: _RequestState, now: float) -> None:
        if self.metrics:
            if state.first_token_at is None:
                self.metrics.on_first_token(now - state.created, state.replica)
            else:
                self.metrics.on_token_gap(now - state.last_token_at, state.replica)
        if state.first_token_at is None:
            state.first_token_at = now
        state.last_token_at = now

    def _flush(self, state: _RequestState, now: float) -> None:
        outputs, state.pending = state.pending, []
        last = outputs[-1]
        ids = [o.token_id for o in outputs if o.token_id is not None]
        if last.finished_reason is None:
            text = state.detokenizer.push(ids)
        else:
            text = state.detokenizer.finish(last.finished_reason, ids)
            self._close(state)
            if last.finished_reason.code == WAITING_TIMEOUT:
                self._shed("waiting_timeout", state.replica)
            elif self.metrics:
                self.metrics.on_finish(now - state.created, last, state.replica)
        if state.logged_text is not None:
            state.logged_text.append(text)
            if last.finished_reason is not None:
                logger.info(f"Finish: rid={state.rid}, finish_reason={last.finished_reason.to_json()}, "
                            f"prompt_tokens={last.prompt_tokens}, completion_tokens={last.completion_tokens}, "
                            f"out={''.join(state.logged_text)!r}")
        logprobs = [(o.token_id, o.logprob, o.top_logprobs) for o in outputs if o.logprob is not None]
        prompt = next((o.input_logprobs for o in outputs if o.input_logprobs is not None), None)
        state.queue.put_nowait(Chunk(text, ids, logprobs, last.finished_reason, last.prompt_tokens,
                                     last.completion_tokens, last.cached_tokens, prompt))
