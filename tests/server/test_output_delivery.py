"""The front end delivers each request's output on its own: one request whose delivery fails — even after it was
closed (its metrics, say) — gets an error at once, and the other requests of the same batch still get theirs."""
from __future__ import annotations

import asyncio

import pytest
import zmq

from toolkit.runtime.io_struct import BatchOutput, FinishReason, TokenOutput
from toolkit.runtime.model_loader.tokenizer import load_fast_tokenizer, prepare_tokenizer_folder
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.tokenizer_manager import SchedulerGone, TokenizerManager

TIMEOUT = 30.0


class BrokenFinishMetrics:
    """Metrics whose end-of-request hook fails for one request."""

    def __init__(self, broken_rid: str) -> None:
        self.broken_rid = broken_rid

    def on_first_token(self, *args) -> None:
        pass

    def on_token_gap(self, *args) -> None:
        pass

    def on_abort(self, *args) -> None:
        pass

    def on_scheduler_stats(self, *args) -> None:
        pass

    def on_finish(self, e2e_seconds: float, last: TokenOutput, dp_rank: int = 0) -> None:
        if last.rid == self.broken_rid:
            raise RuntimeError("a metrics bug")


@pytest.fixture(scope="module")
def tokenizer():
    return load_fast_tokenizer(prepare_tokenizer_folder(None))


async def _collect(chunks) -> list:
    return [chunk async for chunk in chunks]


async def _generate(manager: TokenizerManager, rid: str):
    """Submit once the scheduler's side of the socket is connected (until then a send has no peer)."""
    for _ in range(200):
        try:
            return manager.generate([5, 6], SamplingParams(max_new_tokens=1), stream=True, rid=rid)
        except SchedulerGone:
            await asyncio.sleep(0.05)
    raise AssertionError("the socket never connected")


def test_a_failed_delivery_after_close_reaches_its_client_and_spares_the_others(tokenizer):
    async def scenario() -> None:
        endpoints = IpcEndpoints.fresh()
        manager = TokenizerManager(endpoints, tokenizer, BrokenFinishMetrics("bad"), stream_interval=1)
        scheduler_side = zmq.Context.instance().socket(zmq.PULL)
        scheduler_side.connect(endpoints.to_scheduler)
        try:
            bad = asyncio.ensure_future(_collect(await _generate(manager, "bad")))
            good = asyncio.ensure_future(_collect(await _generate(manager, "good")))
            await asyncio.sleep(0)
            finish = FinishReason("length", matched=1)
            manager._dispatch(BatchOutput([TokenOutput("bad", 28, finish, 2, 1, 0),
                                           TokenOutput("good", 28, finish, 2, 1, 0)]))
            chunks = await asyncio.wait_for(good, TIMEOUT)
            assert chunks[-1].finished_reason == finish and chunks[-1].token_ids == [28]
            with pytest.raises(RuntimeError, match="delivering the output of request bad failed"):
                await asyncio.wait_for(bad, TIMEOUT)
            assert not manager.states
        finally:
            scheduler_side.close(linger=0)
            manager.close()
            endpoints.cleanup()

    asyncio.run(scenario())
