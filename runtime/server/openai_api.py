"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""
from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from toolkit.runtime.server import generation
from toolkit.runtime.server.generation import Choice
from toolkit.runtime.server.protocol import GenerationPlan, parse_chat, parse_completion
from toolkit.runtime.server.sse import parse_request, sse_response
from toolkit.runtime.server.state import STATE, ServerState
from toolkit.runtime.server.tokenizer_manager import Chunk
from toolkit.runtime.server.tool_stream import ToolStream


def finish_reason(choice: Choice) -> str | None:
    reason = choice.finished_reason
    return None if reason is None else reason.kind


def matched_stop(choice: Choice) -> int | str | None:
    reason = choice.finished_reason
    return reason.matched if reason is not None and reason.kind == "stop" else None


def usage(state: ServerState, plan: GenerationPlan, choices: list[Choice]) -> dict[str, Any]:
    # NOTE: each prompt counts once however many samples (n) it produced.
    prompt_tokens = sum(len(ids) for ids in plan.prompts)
    completion_tokens = sum(c.completion_tokens for c in choices)
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if state.args.enable_cache_report:
        cached = sum(c.cached_tokens for c in choices if c.index % plan.params.n == 0)
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


# ---- logprobs formats ----

def completion_logprobs(state: ServerState, entries, offset: int = 0, prompt=()) -> dict[str, Any]:
    """`logprobs` of a completion's tokens from `offset` in its text; with `echo`, the `prompt` tokens' lead (from
    offset 0: the echoed prompt starts the text)."""
    tokens = [state.token_text(token) for token, _, _ in prompt] + [state.token_text(token) for token, _, _ in entries]
    offsets, position = [], 0
    for i, text in enumerate(tokens):
        position = offset if i == len(prompt) else position
        offsets.append(position)
        position += len(text)
    both = [*prompt, *entries]
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in both],
        "top_logprobs": [{state.token_text(t): v for t, v in top} if top else None for _, _, top in both],
        "text_offset": offsets,
    }


def chat_logprobs(state: ServerState, entries) -> dict[str, Any]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        text = state.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**item(t, lp), "top_logprobs": [item(tt, tv) for tt, tv in top or []]}
                        for t, lp, top in entries]}


# ---- /v1/completions ----

def echoed(state: ServerState, plan: GenerationPlan, choice: Choice) -> str:
    """`echo`: the prompt as the client sent it (text), or its token ids decoded."""
    if not plan.echo:
        return ""
    if plan.prompt_texts:
        return plan.prompt_texts[choice.prompt_index]
    return state.tokenizer.decode(plan.prompts[choice.prompt_index], skip_special_tokens=True)


async def completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    plan = await parse_request(request, parse_completion, state.validation)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if plan.stream:
        return await _stream_completion(request, state, plan, rid, created)
    choices = await generation.collect(state.manager, plan)
    return web.json_response({
        "id": rid, "object": "text_completion", "created": created, "model": state.served_model_name,
        "choices": [_completion_choice(state, plan, c) for c in choices],
        "usage": usage(state, plan, choices),
    })


def _completion_choice(state: ServerState, plan: GenerationPlan, choice: Choice) -> dict[str, Any]:
    lead = echoed(state, plan, choice)
    logprobs = None
    if plan.return_logprob:
        logprobs = completion_logprobs(state, choice.logprobs, len(lead), choice.prompt_logprobs)
    return {"index": choice.index, "text": lead + choice.text, "finish_reason": finish_reason(choice),
            "matched_stop": matched_stop(choice), "logprobs": logprobs}


async def _stream_completion(request, state: ServerState, plan: GenerationPlan, rid: str, created: int):
    head = {"id": rid, "object": "text_completion", "created": created, "model": state.served_model_name}
    offsets: dict[int, int] = {}

    leads: dict[int, int] = {}

    def event(choice: Choice, chunk: Chunk) -> dict[str, Any]:
        lead = echoed(state, plan, choice) if choice.index not in offsets else ""
        leads.setdefault(choice.index, len(lead))
        logprobs = None
        if plan.return_logprob:
            logprobs = completion_logprobs(state, chunk.logprobs, leads[choice.index] + offsets.get(choice.index, 0),
                                           chunk.prompt_logprobs or ())
        offsets[choice.index] = len(choice.text)
        return {**head, "choices": [{"index": choice.index, "text": lead + chunk.text, "logprobs": logprobs,
                                     "finish_reason": finish_reason(choice), "matched_stop": matched_stop(choice)}]}

    return await sse_response(request, state, plan, event, head, lambda cs: usage(state, plan, cs))


# ---- /v1/chat/completions ----

async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    plan = await parse_request(request, parse_chat, state.validation)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if plan.stream:
        return await _stream_chat(request, state, plan, rid, created)
    choices = await generation.collect(state.manager, plan)
    return web.json_response({
        "id": rid, "object": "chat.completion", "created": created, "model": state.served_model_name,
        "choices": [_chat_choice(state, plan, c) for c in choices],
        "usage": usage(state, plan, choices),
    })


def _chat_choice(state: ServerState, plan: GenerationPlan, choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    reason = finish_reason(choice)
    if plan.tools is not None:
        content, calls = plan.tools.split(choice.text)
        if calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": [c.openai() for c in calls]}
            reason = "tool_calls" if reason == "stop" else reason
    return {"index": choice.index, "message": message,
            "logprobs": chat_logprobs(state, choice.logprobs) if plan.return_logprob else None,
            "finish_reason": reason, "matched_stop": matched_stop(choice)}


async def _stream_chat(request, state: ServerState, plan: GenerationPlan, rid: str, created: int):
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.served_model_name}
    started: set[int] = set()
    tool_streams: dict[int, ToolStream] = {}

    def entry(choice: Choice, delta: dict[str, Any], logprobs, reason: str | None) -> dict[str, Any]:
        return {**head, "choices": [{"index": choice.index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": reason, "matched_stop": matched_stop(choice) if reason else None}]}

    def event(choice: Choice, chunk: Chunk) -> list[dict[str, Any]]:
        text, deltas, reason = chunk.text, [], finish_reason(choice)
        if plan.tools is not None:
            stream = tool_streams.setdefault(choice.index, ToolStream(plan.tools))
            text, deltas = stream.push(chunk.text)
            if choice.finished_reason is not None:
                rest, more = stream.finish()
                text, deltas = text + rest, deltas + more
                reason = "tool_calls" if stream.called and reason == "stop" else reason
        first: dict[str, Any] = {"content": text}
        if choice.index not in started:
            started.add(choice.index)
            first = {"role": "assistant", **first}
        logprobs = chat_logprobs(state, chunk.logprobs) if plan.return_logprob else None
        if not deltas:
            # NOTE: text held back as a possible call sends nothing yet (OpenAI sends no empty deltas)
            held = plan.tools is not None and not text and reason is None and "role" not in first and not logprobs
            return [] if held else [entry(choice, first, logprobs, reason)]
        events = [entry(choice, first, logprobs, None)] if text or "role" in first else []
        events += [entry(choice, delta, None if events else logprobs, None) for delta in deltas[:1]]
        events += [entry(choice, delta, None, None) for delta in deltas[1:]]
        events[-1]["choices"][0].update(finish_reason=reason, matched_stop=matched_stop(choice))
        return events

    return await sse_response(request, state, plan, event, head, lambda cs: usage(state, plan, cs))


# ---- /v1/models ----

async def models(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    return web.json_response({"object": "list", "data": [{
        "id": state.served_model_name, "object": "model", "created": int(state.started), "owned_by": "toolkit",
        "root": state.args.model_path or state.served_model_name, "max_model_len": state.ready.context_len,
    }]})
