"""The load loop: releases each request at its absolute send time, caps concurrency, and stops cleanly on Ctrl-C."""
from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from time import perf_counter, time

import numpy as np

from toolkit.bench import eventloop
from toolkit.bench.client import Client
from toolkit.bench.conversation import Session, assistant, user
from toolkit.bench.datasets import Prompt
from toolkit.bench.outcome import CANCELLED, SHED, RequestOutcome

_START_LEAD_S = 0.01
_TICK_S = 0.25
_LOOP_PROBE_S = 0.01

Launch = Callable[[int, float], Coroutine]  # (arrival index, dispatch time) -> what to run for that arrival
BodyOf = Callable[[list[dict], Prompt], bytes]  # (messages so far, the turn's prompt) -> request body


@dataclass(slots=True)
class Progress:
    """Counters the ticker hands to the progress display; requests `done` include the `failed` and `shed` ones."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0
    shed: int = 0


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcomes plus the run window: `start` on the perf_counter clock, `started_at`/`ended_at` in unix seconds.

    `loop_lags` (seconds) are the event loop's delays, sampled every few ms during the run: how late it woke for a
    timer that was due, so how late a token's arrival could have been timestamped. `ready_s` is
    how long before `start` the loop was ready to send (negative: the first sends went out behind schedule)."""

    outcomes: list[RequestOutcome]
    start: float
    started_at: float
    ended_at: float
    duration: float
    interrupted: bool
    loop_lags: list[float] = field(default_factory=list)
    ready_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionRun:
    """What every session of a multi-turn run shares."""

    body_of: BodyOf
    think_time: float
    semaphore: asyncio.Semaphore | None
    progress: Progress
    outcomes: list[RequestOutcome]


class Runner:
    """Sends prepared bodies on an absolute schedule through one `Client`, at most `max_concurrency` at a time.

    The schedule starts at `start_at` (unix seconds; several processes given the same one send on one timeline),
    or a moment after the run is called."""

    def __init__(self, client: Client, *, max_concurrency: int | None = None,
                 on_tick: Callable[[Progress], None] | None = None, start_at: float | None = None):
        self.client = client
        self.max_concurrency = max_concurrency
        self.on_tick = on_tick
        self.start_at = start_at
        self.interrupted = False
        self._tasks: set[asyncio.Task] = set()
        self._start = 0.0

    async def run(self, bodies: list[bytes], offsets: np.ndarray, input_lens: list[int]) -> RunResult:
        """Send `bodies[i]` at `offsets[i]` seconds after the start and wait for every response (or Ctrl-C)."""
        outcomes = [RequestOutcome(i, float(o), n) for i, (o, n) in enumerate(zip(offsets, input_lens))]
        progress, semaphore = Progress(total=len(outcomes)), self._semaphore()

        def launch(i: int, now: float):
            outcomes[i].dispatched = now
            return self._one(bodies[i], outcomes[i], semaphore, progress)

        return await self._drive(offsets, launch, outcomes, progress)

    async def run_sessions(self, sessions: list[Session], offsets: np.ndarray, body_of: BodyOf,
                           think_time: float) -> RunResult:
        """Start `sessions[i]` at `offsets[i]`; each sends its turns in order, turn k+1 `think_time` seconds after
        the reply to turn k ended, with that reply in its messages. A failed turn ends its session."""
        progress = Progress(total=sum(len(s.prompts) for s in sessions))
        run = SessionRun(body_of, think_time, self._semaphore(), progress, [])

        def launch(i: int, now: float):
            return self._session(sessions[i], float(offsets[i]), run)

        return await self._drive(offsets, launch, run.outcomes, progress)

    def _semaphore(self) -> asyncio.Semaphore | None:
        return asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None

    async def _drive(self, offsets: np.ndarray, launch: Launch, outcomes: list[RequestOutcome],
                     progress: Progress) -> RunResult:
        # NOTE: objects alive before the run leave the collector's view, so no full collection over a big heap
        # (a loaded tokenizer, torch) pauses the loop mid-run and delays the timestamps of arriving tokens.
        gc.collect()
        gc.freeze()
        started_at = time() + _START_LEAD_S if self.start_at is None else self.start_at
        self._start = start = perf_counter() + (started_at - time())
        loop_lags: list[float] = []
        ready_s = start - perf_counter()
        dispatcher = asyncio.ensure_future(self._dispatch(offsets, launch, start))
        ticker = asyncio.ensure_future(self._tick(progress))
        prober = asyncio.ensure_future(_probe_loop(loop_lags))
        with self._ctrl_c(dispatcher):
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
            while self._tasks:
                await asyncio.wait(list(self._tasks))
        ticker.cancel()
        prober.cancel()
        gc.unfreeze()
        self._report(progress)
        end = max((o.ended for o in outcomes if o.ended), default=start)
        return RunResult(outcomes, start, started_at, started_at + (end - start), end - start, self.interrupted,
                         loop_lags, ready_s)

    async def _dispatch(self, offsets: np.ndarray, launch: Launch, start: float) -> None:
        loop = asyncio.get_running_loop()
        i, count = 0, len(offsets)
        while i < count:
            delay = start + offsets[i] - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = perf_counter()
            # NOTE: every request whose time has come goes out now, so a late wake-up never shifts later sends.
            while i < count and start + offsets[i] <= now:
                task = loop.create_task(launch(i, now))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                i += 1

    async def _session(self, session: Session, offset: float, run: SessionRun) -> None:
        messages: list[dict] = []
        due = offset  # the turn's scheduled send, seconds from the start
        for turn, prompt in enumerate(session.prompts):
            delay = self._start + due - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            messages = [*messages, user(prompt.text)]
            out = RequestOutcome(len(run.outcomes), due, prompt.input_len, session=session.index, turn=turn)
            out.dispatched = perf_counter()
            run.outcomes.append(out)
            await self._one(run.body_of(messages, prompt), out, run.semaphore, run.progress)
            if not out.ok or self.interrupted:
                run.progress.done += len(session.prompts) - turn - 1  # the turns that will not be sent
                return
            messages.append(assistant(out.text))
            due = out.ended - self._start + run.think_time

    async def _one(self, body: bytes, out: RequestOutcome, semaphore, progress: Progress) -> None:
        progress.sent += 1
        try:
            if semaphore is None:
                await self.client.send(body, out)
            else:
                async with semaphore:
                    await self.client.send(body, out)
        except asyncio.CancelledError:
            out.fail(CANCELLED, "stopped while waiting for a --max-concurrency slot", perf_counter())
        progress.done += 1
        progress.failed += out.error not in (None, SHED)
        progress.shed += out.error == SHED

    async def _tick(self, progress: Progress) -> None:
        while True:
            self._report(progress)
            await asyncio.sleep(_TICK_S)

    def _report(self, progress: Progress) -> None:
        if self.on_tick is not None:
            self.on_tick(progress)

    def _ctrl_c(self, dispatcher: asyncio.Future):
        def interrupt() -> None:
            self.interrupted = True
            dispatcher.cancel()
            for task in self._tasks:
                task.cancel()

        return eventloop.on_ctrl_c(interrupt)


async def _probe_loop(lags: list[float]) -> None:
    """Every few ms, records how late the loop woke for a timer that was due: the wait any callback that became
    ready at that moment (a token arriving) had before it ran and read the clock, whether the loop was busy with
    other callbacks or the process was not running at all."""
    while True:
        due = perf_counter() + _LOOP_PROBE_S
        await asyncio.sleep(_LOOP_PROBE_S)
        lags.append(max(0.0, perf_counter() - due))
