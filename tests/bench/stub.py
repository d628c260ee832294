"""A scripted SGLang/OpenAI-compatible stub server for the bench tests (aiohttp, 127.0.0.1, a free port).

Each request's behaviour comes from the `Script` registered under its prompt text (or the default script); the
stub records, on the shared `perf_counter` clock, when each request arrived and when each chunk was written, so
tests compare the client's numbers with what the server really did.

With `capacity=C` the stub is a server of known capacity: it serves at most C requests at once and queues the
rest in arrival order (a queued request's script starts when it gets a slot), so with a script of service time S
it completes at most C / S requests per second and latency SLOs break above that rate. With `max_queued=Q` as
well it sheds load as `toolkit serve --max-queued-requests Q` does: a request that finds Q already waiting for a
slot is answered 503 at once, with Retry-After and an OpenAI-style body.

Replies are deterministic per request: the words of a reply start at an offset drawn from the prompt's text, so two
conversations get different replies and a test can find a reply again in the next turn's messages. With
`prefix_cache=True` the stub behaves as a radix cache would report it: `cached_tokens` is the longest prefix, in
words (the stub's tokens: `prompt_tokens` counts the words of all messages), that the request shares with an earlier
request's prompt followed by its reply; it overrides a script's `cached_tokens`.
"""
from __future__ import annotations

import asyncio
import json
import threading
import zlib
from dataclasses import dataclass, field
from time import perf_counter

from aiohttp import web

from toolkit.tune.launcher import free_port

WORDS = (" the", " and", " of", " in", " to", " a", " is", " on")


@dataclass(frozen=True)
class Script:
    """`chunks[0]` goes out `ttft` s after the request arrives; `chunks[i]` `delay` s after the one before."""

    ttft: float = 0.01
    chunks: tuple[tuple[float, int], ...] = ((0.0, 1), (0.005, 1))
    status: int = 200
    hang: bool = False
    malformed: bool = False
    drop: bool = False
    error_event: bool = False
    error_code: int | str = 500  # the `code` of the error event
    usage: bool = True
    continuous_usage: bool = True
    cached_tokens: int | None = None  # reported in usage.prompt_tokens_details, as `--enable-cache-report` does

    @property
    def output_len(self) -> int:
        return sum(k for _, k in self.chunks)


@dataclass
class Served:
    """What the stub did for one request."""

    key: str
    received: float
    prompt_tokens: int
    body: dict
    path: str
    words: list[str] = field(default_factory=list)  # the whole prompt (every message), split into words
    writes: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    reply: str = ""
    cached_tokens: int | None = None


def _prompt_of(body: dict) -> tuple[str, list[str]]:
    """(the script key: the first message or the prompt, the words of the whole prompt)."""
    if "messages" in body:
        return body["messages"][0]["content"], " ".join(m["content"] for m in body["messages"]).split()
    text = body.get("prompt", body.get("text"))
    if text is None:
        ids = body.get("input_ids") or []
        return f"ids:{len(ids)}", [str(i) for i in ids]
    return text, text.split()


def _shared_prefix(words: list[str], seen: list[str]) -> int:
    n = 0
    for a, b in zip(words, seen):
        if a != b:
            break
        n += 1
    return n


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


class StubServer:
    def __init__(self, scripts: dict[str, Script] | None = None, default: Script = Script(),
                 api_key: str | None = None, capacity: int | None = None, max_queued: int | None = None,
                 prefix_cache: bool = False):
        self.scripts = dict(scripts or {})
        self.prefix_cache = prefix_cache
        self.capacity = capacity
        self.max_queued = max_queued
        self.shed = 0
        self._slots: asyncio.Semaphore | None = None
        self.default = default
        self.api_key = api_key
        self.served: list[Served] = []
        self.metrics_hits = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.serving = 0
        self.max_serving = 0
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/stub/served", self._take_served)
        for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self._generate)
        return app

    async def _take_served(self, request: web.Request) -> web.Response:
        """What the stub did since the last call, on its own clock (for a client in another process to compare its
        numbers with): per request, when it arrived and when each chunk went out. The list is emptied."""
        taken, self.served = self.served, []
        return web.json_response([{"received": s.received, "writes": s.writes} for s in taken])

    async def start(self) -> StubServer:
        if self.capacity is not None:
            self._slots = asyncio.Semaphore(self.capacity)
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> StubServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return await handler(request)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_hits += 1
        running = sum(1 for s in self.served if len(s.writes) < 1)
        text = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="stub"}} {running}\n'
            "# TYPE sglang:num_queue_reqs gauge\n"
            f'sglang:num_queue_reqs{{model_name="stub"}} {self.in_flight - self.serving if self._slots else 0}\n'
            "# TYPE sglang:token_usage gauge\n"
            'sglang:token_usage{model_name="stub",tp_rank="0"} 0.25\n'
            'sglang:token_usage{model_name="stub",tp_rank="1"} 0.75\n'
            "# TYPE sglang:generation_tokens counter\n"
            f'sglang:generation_tokens_total{{model_name="stub"}} {sum(sum(s.counts) for s in self.served)}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if self._queue_full():
            self.shed += 1
            error = {"message": f"The request queue is full (--max-queued-requests {self.max_queued}).",
                     "type": "server_error", "param": None, "code": "queue_full"}
            return web.json_response({"error": error}, status=503, headers={"Retry-After": "1"})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self._slots is None:
                return await self._stream(request)
            async with self._slots:
                self.serving += 1
                self.max_serving = max(self.max_serving, self.serving)
                try:
                    return await self._stream(request)
                finally:
                    self.serving -= 1
        finally:
            self.in_flight -= 1

    def _cached(self, words: list[str]) -> int:
        """The longest prefix `words` shares with an earlier request's prompt words followed by its reply's."""
        seen = [s.words + s.reply.split() for s in self.served]
        return max((_shared_prefix(words, other) for other in seen), default=0)

    def _queue_full(self) -> bool:
        return self.max_queued is not None and self.in_flight - self.serving >= self.max_queued

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        received = perf_counter()
        body = await request.json()
        key, words = _prompt_of(body)
        script = self.scripts.get(key, self.default)
        served = Served(key, received, len(words), body, request.path, words)
        served.cached_tokens = self._cached(words) if self.prefix_cache else script.cached_tokens
        self.served.append(served)
        prompt_tokens, seed = len(words), zlib.crc32(" ".join(words).encode())
        if script.status != 200:
            return web.json_response({"error": {"message": f"scripted {script.status}"}}, status=script.status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if script.hang:
            await asyncio.sleep(30)
        stream_options = body.get("stream_options") or {}
        continuous = script.continuous_usage and stream_options.get("continuous_usage_stats")
        event = _EVENTS[request.path]
        if request.path == "/v1/chat/completions":
            await resp.write(_sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        deadline, done, text = received + script.ttft, 0, ""
        cached = served.cached_tokens
        details = {} if cached is None else {"prompt_tokens_details": {"cached_tokens": cached}}
        for n, (delay, count) in enumerate(script.chunks):
            deadline += delay if n else 0.0
            await asyncio.sleep(max(0.0, deadline - perf_counter()))
            if script.drop and n == len(script.chunks) // 2:
                request.transport.close()
                return resp
            if script.malformed and n == 1:
                await resp.write(b"data: {not json\n\n")
                continue
            if script.error_event and n == 1:
                await resp.write(_sse({"error": {"message": "scripted failure", "code": script.error_code}}))
                return resp
            delta = "".join(WORDS[(seed + done + j) % len(WORDS)] for j in range(count))
            done, text = done + count, text + delta
            served.reply = text
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done, **details} if continuous else None
            served.writes.append(perf_counter())
            served.counts.append(count)
            await resp.write(_sse(event(delta, text, done, prompt_tokens, usage)))
        if script.usage and stream_options.get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                     "total_tokens": prompt_tokens + done, **details}
            await resp.write(_sse({"choices": [], "usage": usage}))
        await resp.write(_sse(b"[DONE]"))
        return resp


def _native(delta: str, text: str, done: int, prompt_tokens: int, usage) -> dict:
    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "finish_reason": None}
    return {"text": text, "meta_info": meta, "index": 0}


def _completion(delta: str, text: str, done: int, prompt_tokens: int, usage) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": delta, "finish_reason": None}],
            "usage": usage}


def _chat(delta: str, text: str, done: int, prompt_tokens: int, usage) -> dict:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}], "usage": usage}


_EVENTS = {"/generate": _native, "/v1/completions": _completion, "/v1/chat/completions": _chat}


class ThreadedStub:
    """The stub on its own event loop in a daemon thread, for tests that drive the blocking CLI."""

    def __init__(self, stub: StubServer):
        self.stub = stub
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(timeout=10)
        return self.stub

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def main() -> None:
    """`python -m tests.bench.stub --port P`: the stub in a process of its own (benchmarks.client_capacity), every
    request answered with `--tokens` one-token events, the first after `--ttft-ms`, then one per `--itl-ms`."""
    import argparse

    from toolkit.bench import eventloop

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    args = parser.parse_args()
    chunks = ((0.0, 1),) + ((args.itl_ms / 1000, 1),) * (args.tokens - 1)
    stub = StubServer(default=Script(ttft=args.ttft_ms / 1000, chunks=chunks))
    stub.port = args.port

    async def serve_forever() -> None:
        async with stub:
            await asyncio.Event().wait()

    try:
        eventloop.run(serve_forever())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
