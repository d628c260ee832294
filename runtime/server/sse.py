"""JSON bodies in, Server-Sent Events out; a client that goes away mid-stream aborts its requests."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from aiohttp import web

from toolkit.runtime.server.admission import Overloaded
from toolkit.runtime.server.generation import Choice, Stream
from toolkit.runtime.server.protocol import GenerationPlan, RequestError, ValidationContext, decode_body
from toolkit.runtime.server.tokenizer_manager import Chunk, SchedulerGone

OFF_LOOP_BYTES = 64 * 1024  # larger bodies are decoded and tokenized on a worker thread


async def parse_request(request: web.Request, parse: Callable[[dict, ValidationContext], GenerationPlan],
                        ctx: ValidationContext) -> GenerationPlan:
    """The request's plan; a large body is parsed off the event loop, so /health and the streams keep flowing."""
    raw = await request.read()
    if len(raw) <= OFF_LOOP_BYTES:
        return parse(decode_body(raw), ctx)
    return await asyncio.to_thread(lambda: parse(decode_body(raw), ctx))


def overloaded_error(exc: Overloaded) -> RequestError:
    """The OpenAI-style body of a shed request: 503, type server_error, code queue_full / waiting_timeout."""
    return RequestError(503, exc.message, kind="server_error", code=exc.reason)


def encode_event(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def sse_response(
    request: web.Request,
    state,
    plan: GenerationPlan,
    event: Callable[[Choice, Chunk], dict[str, Any] | list[dict[str, Any]]],
    head: dict[str, Any],
    usage: Callable[[list[Choice]], dict[str, Any]] | None = None,
) -> web.StreamResponse:
    """Stream every choice's chunks; then the usage chunk (if asked for) and [DONE]. A request shed at admission gets
    its 503 before any header (Overloaded propagates); when the scheduler goes away, the server shuts down or the
    request times out in the queue, the stream still ends properly: an error event, then [DONE]."""
    chunks = Stream(state.manager, plan)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
    try:
        if plan.grammar_param is not None:
            await chunks.wait_first()
        await response.prepare(request)
    except BaseException:
        await chunks.aclose()
        raise
    choices: dict[int, Choice] = {}
    try:
        try:
            async for choice, chunk in chunks:
                choices[choice.index] = choice
                payload = event(choice, chunk)
                for item in payload if isinstance(payload, list) else [payload]:
                    await response.write(encode_event(item))
            if plan.include_usage and usage is not None:
                await response.write(encode_event({**head, "choices": [], "usage": usage(list(choices.values()))}))
        except SchedulerGone as exc:
            error = RequestError(503, str(exc), kind="server_error")
            await response.write(encode_event(error.body()))
        except Overloaded as exc:
            await response.write(encode_event(overloaded_error(exc).body()))
        await response.write(encode_event("[DONE]"))
        await response.write_eof()
    except ConnectionResetError:
        pass  # NOTE: the client left; the Stream has aborted its requests
    return response
