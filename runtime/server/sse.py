"""JSON bodies in, Server-Sent Events out; a client that goes away mid-stream aborts its requests."""
from __future__ import annotations

import json
from typing import Any, Callable

from aiohttp import web

from toolkit.runtime.server import generation
from toolkit.runtime.server.generation import Choice
from toolkit.runtime.server.protocol import GenerationPlan, RequestError
from toolkit.runtime.server.tokenizer_manager import Chunk, SchedulerGone


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object", param="body")
    return body


def encode_event(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def sse_response(
    request: web.Request,
    state,
    plan: GenerationPlan,
    event: Callable[[Choice, Chunk], dict[str, Any]],
    head: dict[str, Any],
    usage: Callable[[list[Choice]], dict[str, Any]] | None = None,
) -> web.StreamResponse:
    """Stream every choice's chunks; then the usage chunk (if asked for) and [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    choices: dict[int, Choice] = {}
    try:
        async for choice, chunk in generation.stream(state.manager, plan):
            choices[choice.index] = choice
            await response.write(encode_event(event(choice, chunk)))
        if plan.include_usage and usage is not None:
            await response.write(encode_event({**head, "choices": [], "usage": usage(list(choices.values()))}))
    except SchedulerGone as exc:
        error = RequestError(503, f"the scheduler is gone: {exc}", kind="server_error")
        await response.write(encode_event(error.body()))
    await response.write(encode_event("[DONE]"))
    await response.write_eof()
    return response
