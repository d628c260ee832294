"""One measured run: warm-up, then the scheduled load with optional `/metrics` sampling alongside."""
from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from toolkit.bench.backends import Backend, RequestOptions, chat_body, request_body
from toolkit.bench.client import Client, auth_headers
from toolkit.bench.outcome import RequestOutcome
from toolkit.bench.runner import Progress, Runner, RunResult
from toolkit.bench.scrape import MetricsScraper
from toolkit.bench.split import WorkerRun
from toolkit.bench.workload import Workload

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """The server under test and how every request to it is phrased."""

    base_url: str
    backend: Backend = "sglang"
    api_key: str | None = None
    model: str | None = None
    ignore_eos: bool = True
    extra_body: dict | None = None
    json_schema: str | None = None

    @property
    def options(self) -> RequestOptions:
        return RequestOptions(self.backend, self.model, self.ignore_eos, dict(self.extra_body or {}), self.json_schema)


@dataclass(frozen=True, slots=True)
class RunSettings:
    request_timeout: float | None = None
    max_concurrency: int | None = None
    warmup_requests: int = 1
    scrape_metrics: bool = False
    scrape_interval: float = 1.0
    keep_text: bool = False


@dataclass(frozen=True, slots=True)
class Measurement:
    run: RunResult
    warmup_failures: int
    scraped: list[dict]
    scrape_error: str | None
    workers: tuple[WorkerRun, ...] = ()  # --workers N > 1: each worker's part of `run`, on the same clock
    worker_backend: str | None = None  # "process" | "ray"; None: sent from this process


async def warm_up(client: Client, bodies: list[bytes]) -> int:
    """Sends the bodies at once and waits for them; returns how many failed."""
    outcomes = [RequestOutcome(i, 0.0, 0) for i in range(len(bodies))]
    await asyncio.gather(*(client.send(b, o) for b, o in zip(bodies, outcomes)))
    return sum(not o.ok for o in outcomes)


def warmup_bodies(workload: Workload, options: RequestOptions, count: int) -> list[bytes]:
    if workload.turns == 1:
        return [request_body(p, options) for p in workload.prompts[:count]]
    # NOTE: sessions' last user turns are never sent first in a conversation, so the warm-up fills no prefix that
    # a session's first turn would then be served from.
    return [request_body(s.prompts[-1], options) for s in workload.sessions[:count]]


async def send_workload(runner: Runner, workload: Workload, options: RequestOptions) -> RunResult:
    if workload.turns > 1:
        body_of = functools.partial(chat_body, opts=options)
        return await runner.run_sessions(workload.sessions, workload.offsets, body_of, workload.think_time)
    bodies = [request_body(p, options) for p in workload.prompts]
    return await runner.run(bodies, workload.offsets, [p.input_len for p in workload.prompts])


async def while_scraping(target: Target, settings: RunSettings,
                         sending: Coroutine[Any, Any, T]) -> tuple[T, list[dict], str | None]:
    """Awaits `sending`, sampling the server's `/metrics` alongside when asked: (its result, samples, error)."""
    scraper = MetricsScraper(target.base_url, auth_headers(target.api_key), settings.scrape_interval)
    scraping = asyncio.ensure_future(scraper.run()) if settings.scrape_metrics else None
    try:
        result = await sending
    finally:
        if scraping is not None:
            scraping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraping
    return result, scraper.samples, scraper.error


def client_for(target: Target, settings: RunSettings, workload: Workload, tokenizer=None) -> Client:
    # NOTE: a multi-turn run keeps every reply's text: the session's next turn sends it back.
    keep_text = settings.keep_text or workload.turns > 1
    return Client(target.base_url, target.backend, api_key=target.api_key, request_timeout=settings.request_timeout,
                  tokenizer=tokenizer, keep_text=keep_text)


async def measure(target: Target, settings: RunSettings, workload: Workload, tokenizer=None,
                  on_tick: Callable[[Progress], None] | None = None) -> Measurement:
    """Warm-up requests first, then the workload on its schedule, sampling `/metrics` alongside when asked."""
    options = target.options
    async with client_for(target, settings, workload, tokenizer) as client:
        warmup_failures = await warm_up(client, warmup_bodies(workload, options, settings.warmup_requests))
        runner = Runner(client, max_concurrency=settings.max_concurrency, on_tick=on_tick)
        run, scraped, scrape_error = await while_scraping(target, settings, send_workload(runner, workload, options))
        client.settle()
    return Measurement(run, warmup_failures, scraped, scrape_error)
