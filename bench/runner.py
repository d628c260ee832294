"""The load loop: releases each request at its absolute send time, caps concurrency, and stops cleanly on Ctrl-C."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter, time

import numpy as np

from toolkit.bench.client import Client
from toolkit.bench.outcome import CANCELLED, RequestOutcome

_START_LEAD_S = 0.01
_TICK_S = 0.25


@dataclass(slots=True)
class Progress:
    """Counters the ticker hands to the progress display; requests `done` include the `failed` ones."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcomes plus the run window: `start` on the perf_counter clock, `started_at`/`ended_at` in unix seconds."""

    outcomes: list[RequestOutcome]
    start: float
    started_at: float
    ended_at: float
    duration: float
    interrupted: bool


class Runner:
    """Sends prepared bodies on an absolute schedule through one `Client`, at most `max_concurrency` at a time."""

    def __init__(self, client: Client, *, max_concurrency: int | None = None,
                 on_tick: Callable[[Progress], None] | None = None):
        self.client = client
        self.max_concurrency = max_concurrency
        self.on_tick = on_tick
        self.interrupted = False
        self._tasks: set[asyncio.Task] = set()

    async def run(self, bodies: list[bytes], offsets: np.ndarray, input_lens: list[int]) -> RunResult:
        """Send `bodies[i]` at `offsets[i]` seconds after the start and wait for every response (or Ctrl-C)."""
        outcomes = [RequestOutcome(i, float(o), n) for i, (o, n) in enumerate(zip(offsets, input_lens))]
        progress = Progress(total=len(outcomes))
        # NOTE: objects alive before the run leave the collector's view, so no full collection over a big heap
        # (a loaded tokenizer, torch) pauses the loop mid-run and delays the timestamps of arriving tokens.
        gc.collect()
        gc.freeze()
        start = perf_counter() + _START_LEAD_S
        started_at = time() + _START_LEAD_S
        dispatcher = asyncio.ensure_future(self._dispatch(bodies, outcomes, start, progress))
        ticker = asyncio.ensure_future(self._tick(progress))
        with self._ctrl_c(dispatcher):
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
            while self._tasks:
                await asyncio.wait(list(self._tasks))
        ticker.cancel()
        gc.unfreeze()
        self._report(progress)
        end = max((o.ended for o in outcomes if o.ended), default=start)
        return RunResult(outcomes, start, started_at, started_at + (end - start), end - start, self.interrupted)

    async def _dispatch(self, bodies, outcomes, start: float, progress: Progress) -> None:
        loop, semaphore = asyncio.get_running_loop(), None
        if self.max_concurrency:
            semaphore = asyncio.Semaphore(self.max_concurrency)
        i, count = 0, len(outcomes)
        while i < count:
            delay = start + outcomes[i].scheduled - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = perf_counter()
            # NOTE: every request whose time has come goes out now, so a late wake-up never shifts later sends.
            while i < count and start + outcomes[i].scheduled <= now:
                outcomes[i].dispatched = now
                task = loop.create_task(self._one(bodies[i], outcomes[i], semaphore, progress))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                i += 1

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
        progress.failed += out.error is not None

    async def _tick(self, progress: Progress) -> None:
        while True:
            self._report(progress)
            await asyncio.sleep(_TICK_S)

    def _report(self, progress: Progress) -> None:
        if self.on_tick is not None:
            self.on_tick(progress)

    @contextlib.contextmanager
    def _ctrl_c(self, dispatcher: asyncio.Future):
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            self.interrupted = True
            dispatcher.cancel()
            for task in self._tasks:
                task.cancel()

        try:
            loop.add_signal_handler(signal.SIGINT, interrupt)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signal support
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGINT)
