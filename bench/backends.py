"""The three server dialects: how a prompt becomes a request body, and how a streamed event yields tokens."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from toolkit.bench.datasets import Prompt
from toolkit.bench.outcome import SHED
from toolkit.bench.sse import StreamError

Backend = Literal["sglang", "openai", "openai-chat"]
BACKENDS: tuple[str, ...] = ("sglang", "openai", "openai-chat")
CHAT_BACKENDS: tuple[str, ...] = ("openai-chat",)  # the dialects that take a conversation (multi-turn runs)
ENDPOINTS = {"sglang": "/generate", "openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# SGLang's bench_serving names for the same dialects.
ALIASES = {"sglang-native": "sglang", "sglang-oai": "openai", "sglang-oai-chat": "openai-chat", "vllm": "openai",
           "vllm-chat": "openai-chat"}


@dataclass(frozen=True, slots=True)
class RequestOptions:
    backend: Backend = "sglang"
    model: str | None = None
    ignore_eos: bool = True
    extra_body: dict = field(default_factory=dict)
    json_schema: str | None = None  # --json-schema: every request's output must match it (a prompt's own wins)


def _merge(body: dict, extra: dict) -> dict:
    for key, value in extra.items():
        body[key] = {**body[key], **value} if isinstance(value, dict) and isinstance(body.get(key), dict) else value
    return body


def _sglang_body(prompt: Prompt, opts: RequestOptions) -> dict:
    sampling = {"temperature": 0.0, "max_new_tokens": prompt.output_len, "ignore_eos": opts.ignore_eos}
    schema = prompt.json_schema or opts.json_schema
    if schema is not None:
        sampling["json_schema"] = schema
    body = {"input_ids": prompt.input_ids} if prompt.input_ids is not None else {"text": prompt.text}
    return {**body, "sampling_params": sampling, "stream": True}


def _openai_body(prompt: Prompt, opts: RequestOptions, messages: list[dict] | None = None) -> dict:
    body: dict = {"model": opts.model}
    if opts.backend == "openai-chat":
        body["messages"] = messages if messages is not None else [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    body.update(temperature=0.0, max_tokens=prompt.output_len, stream=True)
    schema = prompt.json_schema or opts.json_schema
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": json.loads(schema), "strict": True}}
    # NOTE: continuous usage (SGLang, vLLM) gives exact per-chunk token counts; extra_body may turn it off.
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if opts.ignore_eos:
        body["ignore_eos"] = True
    return body


def request_body(prompt: Prompt, opts: RequestOptions) -> bytes:
    body = _sglang_body(prompt, opts) if opts.backend == "sglang" else _openai_body(prompt, opts)
    return json.dumps(_merge(body, opts.extra_body)).encode()


def chat_body(messages: list[dict], prompt: Prompt, opts: RequestOptions) -> bytes:
    """A chat request for a whole conversation; `prompt` (its last user turn) gives the output length."""
    if opts.backend not in CHAT_BACKENDS:
        raise ValueError(f"backend {opts.backend!r} takes no conversation; use one of {', '.join(CHAT_BACKENDS)}")
    return json.dumps(_merge(_openai_body(prompt, opts, messages), opts.extra_body)).encode()


@dataclass(slots=True)
class StreamTokens:
    """Token-bearing events of one response. A count is None where the server did not say how many tokens."""

    times: list[float] = field(default_factory=list)
    counts: list[int | None] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache, where it says

    def add(self, t: float, count: int | None, text: str) -> None:
        if count == 0 or (count is None and not text):
            return
        self.times.append(t)
        self.counts.append(count)
        self.texts.append(text)


SHED_CODES = (503, "503", "queue_full", "waiting_timeout")  # an in-stream error that means the server shed load


def _check_error(obj: object) -> None:
    if not isinstance(obj, dict):
        raise StreamError("malformed_response", f"event is not a JSON object: {str(obj)[:80]}")
    if "error" in obj:
        error = obj["error"]
        if not isinstance(error, dict):
            raise StreamError("server_error", str(error))
        kind = SHED if error.get("code", obj.get("code")) in SHED_CODES else "server_error"
        raise StreamError(kind, str(error.get("message", error)))


def _read_sglang(events: list[tuple[float, object]]) -> StreamTokens:
    tokens, seen_text, seen_tokens = StreamTokens(), "", 0
    for t, obj in events:
        _check_error(obj)
        meta, text = obj.get("meta_info") or {}, obj.get("text") or ""
        done = meta.get("completion_tokens")
        count = None if done is None else done - seen_tokens
        tokens.add(t, count, text[len(seen_text):])
        seen_text, seen_tokens = text, seen_tokens if done is None else done
        tokens.prompt_tokens = meta.get("prompt_tokens", tokens.prompt_tokens)
        tokens.cached_tokens = meta.get("cached_tokens", tokens.cached_tokens)
        tokens.completion_tokens = done if done is not None else tokens.completion_tokens
    return tokens


def _choice_text(choice: dict, chat: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("reasoning_content") or "") + (delta.get("content") or "")


def _read_openai(events: list[tuple[float, object]], chat: bool) -> StreamTokens:
    tokens, seen_tokens = StreamTokens(), 0
    for t, obj in events:
        _check_error(obj)
        usage, choices = obj.get("usage") or {}, obj.get("choices")
        done = usage.get("completion_tokens")
        if choices:
            text = "".join([_choice_text(c, chat) for c in choices if isinstance(c, dict)])
            tokens.add(t, None if done is None else done - seen_tokens, text)
        if done is not None:
            seen_tokens = done
            tokens.completion_tokens = done
            tokens.prompt_tokens = usage.get("prompt_tokens", tokens.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            tokens.cached_tokens = details.get("cached_tokens", tokens.cached_tokens)
    return tokens


def read_tokens(backend: Backend, events: list[tuple[float, object]]) -> StreamTokens:
    """The token events of a stream; raises `StreamError` on an in-stream error or a malformed event."""
    if backend == "sglang":
        return _read_sglang(events)
    return _read_openai(events, chat=backend == "openai-chat")
