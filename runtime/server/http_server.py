"""The aiohttp application: routes, API-key auth, OpenAI-style errors, SGLang-style access log lines.

What a client can see when things go wrong: a 4xx naming the field (`protocol`), 413 for an oversized body, 503
with a plain sentence when the scheduler is gone or the server is shutting down, 503 with `Retry-After` when the
server sheds the request (`admission`), and for anything else a 500 with an error id whose traceback is in the
log — never a traceback, a path or an exception's text in a response.
"""
from __future__ import annotations

import hmac
import logging
import uuid

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from toolkit.runtime.server import native_api, openai_api, tokenize_api
from toolkit.runtime.server.admission import Overloaded
from toolkit.runtime.server.limits import MAX_BODY_BYTES
from toolkit.runtime.server.protocol import RequestError
from toolkit.runtime.server.sse import overloaded_error
from toolkit.runtime.server.state import STATE, ServerState
from toolkit.runtime.server.tokenizer_manager import SchedulerGone

logger = logging.getLogger("runtime")
UNAUTHENTICATED_PATHS = frozenset({"/health"})
SHUTTING_DOWN = "the server is shutting down and accepts no new requests"
CLIENT_CLOSED = 499  # nginx's "client closed request": only the access log ever shows it


def _json_error(error: RequestError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as error:
        return _json_error(error)
    except web.HTTPRequestEntityTooLarge:
        return _json_error(RequestError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", param="body",
                                        code="request_too_large"))
    except SchedulerGone as exc:
        return _json_error(RequestError(503, str(exc), kind="server_error"))
    except Overloaded as exc:
        response = _json_error(overloaded_error(exc))
        response.headers["Retry-After"] = str(exc.retry_after)
        return response
    except ConnectionResetError:
        logger.info(f"the client of {request.method} {request.path} disconnected before the response")
        return web.Response(status=CLIENT_CLOSED, reason="Client Closed Request")
    except web.HTTPException:
        raise
    except Exception:
        error_id = uuid.uuid4().hex[:12]
        logger.exception(f"internal error {error_id} while serving {request.method} {request.path}")
        return _json_error(RequestError(500, f"internal server error (error id {error_id}); the details are in the "
                                             "server log", kind="server_error"))


@web.middleware
async def draining_middleware(request: web.Request, handler) -> web.StreamResponse:
    if request.app[STATE].draining:
        return _json_error(RequestError(503, SHUTTING_DOWN, kind="server_error", code="server_shutting_down"))
    return await handler(request)


def bearer_token(header: str) -> str | None:
    """The credentials of `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 7235 §2.1)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def auth_middleware(api_key: str):
    expected = api_key.encode()

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        if request.path not in UNAUTHENTICATED_PATHS:
            token = bearer_token(request.headers.get("Authorization", ""))
            given = token.encode("utf-8", "replace") if token is not None else b""
            if token is None or not hmac.compare_digest(given, expected):
                return _json_error(RequestError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                                                code="invalid_api_key", kind="authentication_error"))
        return await handler(request)

    return check


async def _not_found(request: web.Request) -> web.Response:
    raise RequestError(404, f"no route for {request.method} {request.path[:200]}", code="not_found")


def build_app(state: ServerState) -> web.Application:
    middlewares = [errors_middleware, draining_middleware]
    if state.args.api_key:
        middlewares.append(auth_middleware(state.args.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.router.add_post("/v1/completions", openai_api.completions)
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_get("/v1/models", openai_api.models)
    for prefix in ("", "/v1"):  # NOTE: vLLM serves them at the root; SGLang also under /v1
        app.router.add_post(f"{prefix}/tokenize", tokenize_api.tokenize)
        app.router.add_post(f"{prefix}/detokenize", tokenize_api.detokenize)
    app.router.add_post("/generate", native_api.generate)
    app.router.add_get("/health", native_api.health)
    app.router.add_get("/health_generate", native_api.health_generate)
    for prefix in ("/get_", "/"):  # NOTE: SGLang's newer names (what sglang-router asks) and the older ones
        app.router.add_get(f"{prefix}model_info", native_api.get_model_info)
        app.router.add_get(f"{prefix}server_info", native_api.get_server_info)
    app.router.add_get("/get_load", native_api.get_load)
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
