"""The aiohttp application: routes, API-key auth, OpenAI-style errors, SGLang-style access log lines."""
from __future__ import annotations

import hmac
import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from toolkit.runtime.server import native_api, openai_api
from toolkit.runtime.server.protocol import RequestError
from toolkit.runtime.server.state import ServerState
from toolkit.runtime.server.tokenizer_manager import SchedulerGone

logger = logging.getLogger("runtime")
MAX_BODY_BYTES = 8 * 1024 * 1024
UNAUTHENTICATED_PATHS = frozenset({"/health"})


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as error:
        return web.json_response(error.body(), status=error.status)
    except web.HTTPRequestEntityTooLarge:
        error = RequestError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", param="body",
                             code="request_too_large")
        return web.json_response(error.body(), status=413)
    except SchedulerGone as exc:
        error = RequestError(503, f"the scheduler is gone: {exc}", kind="server_error")
        return web.json_response(error.body(), status=503)
    except web.HTTPException:
        raise
    except Exception as exc:
        logger.exception(f"internal error while serving {request.method} {request.path}")
        error = RequestError(500, f"internal server error: {type(exc).__name__}: {exc}", kind="server_error")
        return web.json_response(error.body(), status=500)


def auth_middleware(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        if request.path not in UNAUTHENTICATED_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                error = RequestError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                                     code="invalid_api_key", kind="authentication_error")
                return web.json_response(error.body(), status=401)
        return await handler(request)

    return check


async def _not_found(request: web.Request) -> web.Response:
    raise RequestError(404, f"no route for {request.method} {request.path}", code="not_found")


def build_app(state: ServerState) -> web.Application:
    middlewares = [errors_middleware]
    if state.args.api_key:
        middlewares.insert(0, auth_middleware(state.args.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app["state"] = state
    app.router.add_post("/v1/completions", openai_api.completions)
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_get("/v1/models", openai_api.models)
    app.router.add_post("/generate", native_api.generate)
    app.router.add_get("/health", native_api.health)
    app.router.add_get("/health_generate", native_api.health_generate)
    app.router.add_get("/get_model_info", native_api.get_model_info)
    app.router.add_get("/get_server_info", native_api.get_server_info)
    app.router.add_post("/flush_cache", native_api.flush_cache)
    app.router.add_get("/flush_cache", native_api.flush_cache)
    app.router.add_get("/metrics", native_api.metrics)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app


class AccessLogger(AbstractAccessLogger):
    """uvicorn's line, as SGLang's logs carry it: `INFO:     127.0.0.1:5432 - "POST /generate HTTP/1.1" 200 OK`."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        host = f"{peer[0]}:{peer[1]}" if peer else "-"
        version = f"{request.version.major}.{request.version.minor}"
        self.logger.info(f'INFO:     {host} - "{request.method} {request.path_qs} HTTP/{version}" '
                         f"{response.status} {response.reason}")
