"""vLLM's `/tokenize` and `/detokenize` (also under `/v1/`): text or chat messages to token ids, and back.

    POST /tokenize    {"prompt": str, "add_special_tokens": true, "return_token_strs": false}
                   or {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false, ...}
                   -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [int, ...]} -> {"prompt": str}
"""
from __future__ import annotations

from aiohttp import web

from toolkit.runtime.server.protocol import ValidationContext, bad, check_model, decode_body
from toolkit.runtime.server.protocol import chat_messages, prompt_text, token_ids
from toolkit.runtime.server.state import STATE, ServerState


def _encoded(body: dict, state: ServerState) -> list[int]:
    ctx: ValidationContext = state.validation
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise bad("prompt", "pass exactly one of prompt or messages")
    if body.get("prompt") is not None:
        text = prompt_text(body, "prompt", ctx)
        add_special = _flag(body, "add_special_tokens", True)
        return state.tokenizer.encode(text, add_special_tokens=add_special)
    messages = chat_messages(body, ctx)
    generation_prompt = _flag(body, "add_generation_prompt", True)
    try:
        return state.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt)
    except ValueError as exc:
        raise bad("messages", f"the chat template rejected the messages: {str(exc)[:300]}") from None


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad(name, "must be a boolean")
    return value


async def tokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    body = decode_body(await request.read())
    check_model(body, state.validation)
    ids = _encoded(body, state)
    strs = [state.tokenizer.backend.id_to_token(t) for t in ids] if _flag(body, "return_token_strs", False) else None
    return web.json_response({"count": len(ids), "max_model_len": state.ready.context_len, "tokens": ids,
                              "token_strs": strs})


async def detokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    body = decode_body(await request.read())
    check_model(body, state.validation)
    ids = token_ids(body, "tokens", state.validation.vocab_size)
    return web.json_response({"prompt": state.tokenizer.decode(ids)})
