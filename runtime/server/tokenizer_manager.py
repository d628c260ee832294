"""The front end's side of generation: submits tokenized requests to the scheduler process, routes its
per-step outputs back to each waiting HTTP handler, detokenizes incrementally, aborts on disconnect."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from toolkit.runtime.io_struct import (
    AbortRequest,
    BatchOutput,
    FinishReason,
    FlushCacheRequest,
    FlushCacheResult,
    GenerateInput,
    SchedulerFailed,
    SchedulerReady,
    ShutdownRequest,
    TokenOutput,
)
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server.detokenizer import IncrementalDetokenizer
from toolkit.runtime.server.ipc import IpcEndpoints
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


class SchedulerGone(RuntimeError):
    """The scheduler cannot serve the request: it died, or the server is shutting down. The message is for
    clients (a sentence, never a traceback)."""


SCHEDULER_FAILED = "the scheduler process failed; the error is in the server log"


class TokenizerManager:
    def __init__(self, endpoints: IpcEndpoints, tokenizer, metrics: RequestMetrics | None,
                 stream_interval: int) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.stream_interval = stream_interval
        self.context = zmq.asyncio.Context(1)
        # NOTE: a plain (blocking-API) socket over the same context: with NOBLOCK a send either queues at once or
        # raises zmq.Again here (no peer: the scheduler is gone), never a Future whose error nobody retrieves.
        self.to_scheduler = zmq.Context.shadow(self.context.underlying).socket(zmq.PUSH)
        self.to_scheduler.setsockopt(zmq.SNDHWM, 0)
        self.to_scheduler.bind(endpoints.to_scheduler)
        self.from_scheduler = self.context.socket(zmq.PULL)
        self.from_scheduler.bind(endpoints.from_scheduler)
        self.states: dict[str, _RequestState] = {}
        self.stats: dict[str, Any] = {}
        self.ready: SchedulerReady | None = None
        self.failure: str | None = None  # why requests are refused, in words for clients
        self.failure_detail: str | None = None  # the scheduler's own report (a traceback), for the log
        self._flush_waiters: list[asyncio.Future] = []

    # ---- lifecycle ----
    async def wait_ready(self, timeout: float) -> SchedulerReady:
        deadline = time.monotonic() + timeout
        while self.ready is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self.from_scheduler.poll(int(min(remaining, 1.0) * 1000)):
                if remaining <= 0:
                    raise SchedulerGone(f"the scheduler was not ready within {timeout:.0f} s")
                continue
            self._dispatch(await self.from_scheduler.recv_pyobj())
            if self.failure:
                raise SchedulerGone(f"the scheduler failed to start:\n{self.failure_detail or self.failure}")
        return self.ready

    async def receive_forever(self) -> None:
        while True:
            self._dispatch(await self.from_scheduler.recv_pyobj())

    def close(self) -> None:
        self.to_scheduler.close(linger=100)
        self.context.destroy(linger=100)

    def fail_all(self, message: str) -> int:
        """Finish every waiting request with SchedulerGone(message) and refuse new ones; returns how many."""
        self.failure = message
        states = list(self.states.values())
        for state in states:
            state.finished = True
            state.queue.put_nowait(SchedulerGone(message))
        self.states.clear()
        if self.metrics:
            for _ in states:
                self.metrics.on_abort()
        return len(states)

    def shutdown(self, message: str) -> int:
        """Graceful stop: end every open request now, then ask the scheduler to abort them all, free their KV
        and exit. Returns how many requests were open."""
        aborted = self.fail_all(message)
        self._send(ShutdownRequest())
        return aborted

    def _send(self, message: object) -> bool:
        """Queue a message for the scheduler; False when it cannot take one (it is gone)."""
        try:
            self.to_scheduler.send_pyobj(message, zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    # ---- requests ----
    def generate(self, input_ids: list[int], params: SamplingParams, return_logprob: bool = False,
                 top_logprobs_num: int = 0, stream: bool = False, rid: str | None = None) -> AsyncIterator[Chunk]:
        """Submit one generation; iterate its chunks (one per `stream_interval` tokens when streaming)."""
        if self.failure is not None:
            raise SchedulerGone(self.failure)
        rid = rid or uuid.uuid4().hex
        if not self._send(GenerateInput(rid, input_ids, params, return_logprob, top_logprobs_num)):
            raise SchedulerGone("the scheduler process is not accepting requests")
        state = _RequestState(
            rid, IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop), asyncio.Queue(),
            self.stream_interval if stream else 1 << 30,
        )
        self.states[rid] = state
        return self._chunks(state)

    async def _chunks(self, state: _RequestState) -> AsyncIterator[Chunk]:
        try:
            while True:
                item = await state.queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished_reason is not None:
                    return
        finally:
            if not state.finished:
                self.abort(state.rid)

    def abort(self, rid: str) -> None:
        state = self.states.pop(rid, None)
        if state is None:
            return
        state.finished = True
        if self.metrics:
            self.metrics.on_abort()
        self._send(AbortRequest(rid))

    async def flush_cache(self, timeout: float = 10.0) -> bool:
        if self.failure is not None or not self._send(FlushCacheRequest()):
            raise SchedulerGone(self.failure or "the scheduler process is not accepting requests")
        future = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(future)
        return await asyncio.wait_for(future, timeout)

    # ---- outputs ----
    def _dispatch(self, message: object) -> None:
        if isinstance(message, BatchOutput):
            self.stats = message.stats
            if self.metrics:
                self.metrics.on_scheduler_stats(message.stats)
            for output in message.outputs:
                try:
                    self._route(output)
                except Exception:  # NOTE: one request's failure must not stall every other request's output
                    logger.exception(f"failed to deliver the output of request {output.rid}")
                    self._fail(output.rid)
        elif isinstance(message, SchedulerReady):
            self.ready = message
        elif isinstance(message, FlushCacheResult):
            for waiter in self._flush_waiters:
                if not waiter.done():
                    waiter.set_result(message.ok)
            self._flush_waiters.clear()
        elif isinstance(message, SchedulerFailed):
            self.failure_detail = message.message
            self.fail_all(SCHEDULER_FAILED)

    def _fail(self, rid: str) -> None:
        state = self.states.pop(rid, None)
        if state is not None:
            state.finished = True
            state.queue.put_nowait(RuntimeError(f"delivering the output of request {rid} failed"))
            self._send(AbortRequest(rid))

    def _route(self, output: TokenOutput) -> None:
        state = self.states.get(output.rid)
        if state is None:
            return
        now = time.perf_counter()
        if output.token_id is not None:
            self._time_token(state, now)
        state.pending.append(output)
        if output.finished_reason is not None or len(state.pending) >= state.stream_interval:
            self._flush(state, now)

    def _time_token(self, state: _RequestState, now: float) -> None:
        if self.metrics:
            if state.first_token_at is None:
                self.metrics.on_first_token(now - state.created)
            else:
                self.metrics.on_token_gap(now - state.last_token_at)
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
            state.finished = True
            self.states.pop(state.rid, None)
            if self.metrics:
                self.metrics.on_finish(now - state.created, last)
        logprobs = [(o.token_id, o.logprob, o.top_logprobs) for o in outputs if o.logprob is not None]
        state.queue.put_nowait(Chunk(text, ids, logprobs, last.finished_reason, last.prompt_tokens,
                                     last.completion_tokens, last.cached_tokens))
