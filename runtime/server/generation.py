"""Running a GenerationPlan: one generation per (prompt, sample), collected whole or merged as a stream."""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.io_struct import FinishReason, LogprobEntry
from toolkit.runtime.server.protocol import GenerationPlan, RequestError, bad
from toolkit.runtime.server.tokenizer_manager import Chunk, GrammarRejected, TokenizerManager


@dataclass
class Choice:
    """One generated sequence, accumulated from its chunks."""

    index: int
    prompt_index: int
    rid: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[int, float, list[tuple[int, float]] | None]] = field(default_factory=list)
    prompt_logprobs: list[LogprobEntry] = field(default_factory=list)
    finished_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.prompt_logprobs += chunk.prompt_logprobs or []
        self.finished_reason = chunk.finished_reason
        self.prompt_tokens, self.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        self.cached_tokens = chunk.cached_tokens


def choice_params(params: SamplingParams, sample: int) -> SamplingParams:
    """The n samples of one prompt get distinct seeds when the request fixed one."""
    if params.seed is None or sample == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + sample)


def sequences(plan: GenerationPlan) -> int:
    """How many scheduler requests the plan makes: one per (prompt, sample)."""
    return sum(plan.params_for(p).n for p in range(len(plan.prompts)))


def _streams(manager: TokenizerManager, plan: GenerationPlan, stream: bool) -> list[tuple[Choice, AsyncIterator[Chunk]]]:
    """Admit the plan (raises Overloaded, before anything is sent, when the waiting queue is full) and submit it."""
    manager.admit(sequences(plan))
    streams = []
    for p, ids in enumerate(plan.prompts):
        params = plan.params_for(p)
        for sample in range(params.n):
            choice = Choice(index=len(streams), prompt_index=p, rid=uuid.uuid4().hex)
            chunks = manager.generate(ids, choice_params(params, sample), plan.return_logprob,
                                      plan.top_logprobs_num, stream=stream, rid=choice.rid,
                                      logprob_start_len=plan.logprob_start_len)
            streams.append((choice, chunks))
    return streams


async def _stop(manager: TokenizerManager, tasks: list[asyncio.Future], choices: list[Choice]) -> None:
    """Cancel the per-choice tasks (their generators abort unfinished requests) and abort any left over."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for choice in choices:
        manager.abort(choice.rid)


async def collect(manager: TokenizerManager, plan: GenerationPlan) -> list[Choice]:
    streams = _streams(manager, plan, stream=False)

    async def drain(choice: Choice, chunks: AsyncIterator[Chunk]) -> Choice:
        async for chunk in chunks:
            choice.add(chunk)
        return choice

    tasks = [asyncio.ensure_future(drain(c, s)) for c, s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except GrammarRejected as exc:
        raise grammar_error(plan, exc) from None
    finally:
        await _stop(manager, tasks, [c for c, _ in streams])


def grammar_error(plan: GenerationPlan, exc: GrammarRejected) -> RequestError:
    """400 naming the field that carried the refused grammar."""
    return bad(plan.grammar_param or "grammar", str(exc))


class Stream:
    """A plan admitted and submitted at construction, its chunks (every choice's, interleaved in arrival order, each
    choice updated before it is yielded) read later: a shed request raises before the caller sends a response, and
    `aclose` aborts an admitted one whose response never starts."""

    def __init__(self, manager: TokenizerManager, plan: GenerationPlan) -> None:
        self.manager = manager
        self.plan = plan
        self.streams = _streams(manager, plan, stream=True)
        self.chunks = _merged(manager, self.streams)
        self._head: list[tuple[Choice, Chunk]] = []

    async def wait_first(self) -> None:
        """Wait for the first chunk before the response starts: a constrained stream's grammar is refused with a
        plain 400 (RequestError), never inside a stream already answered 200."""
        try:
            self._head = [await anext(self.chunks)]
        except StopAsyncIteration:
            pass
        except GrammarRejected as exc:
            raise grammar_error(self.plan, exc) from None

    def __aiter__(self) -> AsyncIterator[tuple[Choice, Chunk]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[Choice, Chunk]]:
        for item in self._head:
            yield item
        self._head = []
        async for item in self.chunks:
            yield item

    async def aclose(self) -> None:
        await self.chunks.aclose()
        for choice, _ in self.streams:  # NOTE: a generator never started runs no `finally`
            self.manager.abort(choice.rid)


async def _merged(manager: TokenizerManager,
                  streams: list[tuple[Choice, AsyncIterator[Chunk]]]) -> AsyncIterator[tuple[Choice, Chunk]]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: Choice, chunks: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in chunks:
                choice.add(chunk)
                await queue.put((choice, chunk))
        except Exception as exc:  # a dead scheduler surfaces here; re-raised to the handler below
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(c, s)) for c, s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        await _stop(manager, tasks, [c for c, _ in streams])
