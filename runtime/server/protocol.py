"""Request bodies of the HTTP API → validated generation plans; every rejection names the offending field.
The limits are `toolkit.runtime.server.limits`'."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.runtime.io_struct import context_length_error, logit_bias_error
from toolkit.runtime.sampling.sampling_params import SamplingParams, SamplingParamsError, shown
from toolkit.runtime.server import limits
from toolkit.runtime.server.limits import MAX_LOGPROBS, MAX_N
from toolkit.runtime.server.grammar_requests import logit_bias, output_grammar
from toolkit.runtime.server.request_fields import RequestError, bad, boolean, typed, valid_text
from toolkit.runtime.server.tool_calls import ToolPlan
from toolkit.runtime.server.tool_requests import encode_tool_chat, message_calls, tool_plan

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_OPENAI_NAMES = {"max_new_tokens": "max_tokens"}


@dataclass
class ValidationContext:
    served_model_name: str
    context_len: int
    vocab_size: int
    allow_auto_truncate: bool
    encode: Callable[[str], list[int]]
    encode_chat: Callable[..., list[int]]  # (messages, tools=None) -> the chat prompt's ids
    max_token_chars: int = 0  # the longest token's text; 0 when unknown
    tool_parser: str = "smollm2"  # the chat template's tool-call format (--tool-call-parser, or detected)
    native_tools: bool = False  # the chat template renders `tools` itself
    constrained: bool = True  # a grammar backend serves constrained requests (--grammar-backend is not none)

    @property
    def max_prompt_chars(self) -> int | None:
        """Longer text cannot fit the context (a token spans at most `max_token_chars` characters), so it is
        refused before the tokenizer spends seconds on it; None when unknown or when prompts may be truncated."""
        if not self.max_token_chars or self.allow_auto_truncate:
            return None
        return self.context_len * self.max_token_chars


@dataclass
class GenerationPlan:
    """What to generate: one entry per prompt, each sampled `params.n` times."""

    prompts: list[list[int]]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    single: bool = True  # a single prompt (native API: answer with an object, not a list)
    per_prompt_params: list[SamplingParams] = field(default_factory=list)
    grammar_param: str | None = None  # the field that constrains the output (a grammar error names it)
    tools: ToolPlan | None = None  # chat with tools: how calls are parsed out of each choice
    echo: bool = False  # completions: the prompt's text leads each choice's text
    logprob_start_len: int = -1  # the first prompt position whose logprob is returned; -1 for none
    prompt_texts: list[str] = field(default_factory=list)  # the prompts as text, when they came as text

    def params_for(self, index: int) -> SamplingParams:
        return self.per_prompt_params[index] if self.per_prompt_params else self.params


# ---- the body ----

class _NumberTooLong(ValueError):
    pass


def _number_literal(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if len(text) > limits.MAX_NUMBER_CHARS:
            raise _NumberTooLong(len(text))
        return convert(text)

    return parse


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, within the limits on nesting and number length."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_int=_number_literal(int), parse_float=_number_literal(float))
    except _NumberTooLong as exc:
        raise bad("body", f"a number in the body has {exc.args[0]} characters; at most "
                          f"{limits.MAX_NUMBER_CHARS} are allowed") from None
    except RecursionError:
        raise bad("body", f"the body is nested deeper than {limits.MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object", param="body")
    if raw.count(b"[") + raw.count(b"{") > limits.MAX_JSON_DEPTH and _nested_deeper(body, limits.MAX_JSON_DEPTH):
        raise bad("body", f"the body is nested deeper than {limits.MAX_JSON_DEPTH} levels")
    return body


def _nested_deeper(value: Any, limit: int) -> bool:
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (list, dict))]
        depth += 1
    return False


# ---- typed field access ----

def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = typed(body, name, (int, float), default, "a number")
    # NOTE: compared before float(): float() of a 400-digit integer raises OverflowError.
    if value != value or (value <= low if low_open else value < low) or value > high:
        raise bad(name, f"must be in {'(' if low_open else '['}{low}, {high}], got {shown(value)}")
    return float(value)


def _int(body: dict, name: str, default: int | None, low: int | None = None, high: int | None = None) -> int | None:
    value = typed(body, name, (int,), default, "an integer")
    if value is None:
        return None
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad(name, f"must be in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}], "
                        f"got {shown(value)}")
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop", "must be a non-empty string or a list of non-empty strings")
    return stop


def _check_prompt_chars(chars: int, ctx: ValidationContext, param: str) -> None:
    limit = ctx.max_prompt_chars
    if limit is not None and chars > limit:
        raise bad(param, f"{chars} characters cannot fit the model's context of {ctx.context_len} tokens")


def _encode(text: str, ctx: ValidationContext, param: str) -> list[int]:
    _check_prompt_chars(len(valid_text(text, param)), ctx, param)
    return ctx.encode(text)


def _check_sequences(total: int, param: str) -> None:
    """One request may ask for at most MAX_SEQUENCES generations (prompts × n)."""
    if total > limits.MAX_SEQUENCES:
        raise bad(param, f"the request asks for {total} sequences (prompts × n); at most {limits.MAX_SEQUENCES} "
                         "are allowed")


def _token_list(value: Any, name: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise bad(name, "must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in value):
        raise bad(name, f"token ids must be integers in [0, {vocab_size})")
    return value


def check_model(body: dict, ctx: ValidationContext) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad("model", "must be a string")
    if model != ctx.served_model_name:
        raise RequestError(404, f"The model {shown(model)} does not exist; this server serves "
                                f"`{ctx.served_model_name}`.", param="model", code="model_not_found")


_HARMLESS_VALUES: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""), "best_of": (None, 1), "functions": (None, []),
}


def _unsupported(body: dict, names: tuple[str, ...]) -> None:
    """Features we do not implement are refused unless set to their no-op value."""
    for name in names:
        value = body.get(name)
        if not any(value is v or (type(value) is type(v) and value == v) for v in _HARMLESS_VALUES[name]):
            raise bad(name, "is not supported by this server")


# ---- OpenAI sampling fields shared by completions and chat ----

def openai_sampling(body: dict, max_tokens: int | None, default_max_tokens: int, ctx: ValidationContext,
                    grammar: dict[str, Any] | None = None) -> SamplingParams:
    params = dict(
        max_new_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, limits.TEMPERATURE_MAX),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_int(body, "top_k", -1, -1, limits.TOP_K_MAX),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0, low_open=True),
        stop=_stop(body),
        stop_token_ids=_token_ids_field(body, "stop_token_ids"),
        ignore_eos=boolean(body, "ignore_eos", False),
        skip_special_tokens=boolean(body, "skip_special_tokens", True),
        seed=_int(body, "seed", None, limits.SEED_MIN, limits.SEED_MAX),
        n=_int(body, "n", 1, 1, MAX_N),
        logit_bias=logit_bias(body, ctx.vocab_size),
        **(grammar or {}),
    )
    if params["top_k"] == 0:
        raise bad("top_k", "must be -1 (disabled) or at least 1, got 0")
    try:
        return SamplingParams.from_dict(params)
    except SamplingParamsError as exc:
        name = _OPENAI_NAMES.get(exc.param, exc.param)
        raise bad(name, str(exc)) from None


def _check_constrained(plan: GenerationPlan, ctx: ValidationContext) -> GenerationPlan:
    if plan.grammar_param is not None and not ctx.constrained:
        raise bad(plan.grammar_param, "constrained decoding is off on this server (--grammar-backend none)")
    return plan


def _token_ids_field(body: dict, name: str) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise bad(name, "must be a list of non-negative integers")
    return value


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad("stream_options", "must be an object")
    if not stream:
        raise bad("stream_options", "is only allowed when stream is true")
    return boolean(options, "include_usage", False)


def fit_context(ids: list[int], params: SamplingParams, ctx: ValidationContext, param: str,
                max_tokens_param: str = "max_tokens") -> list[int]:
    """Reject (or with --allow-auto-truncate, cut) prompts that do not fit the context with their max_tokens."""
    error = context_length_error(len(ids), params.max_new_tokens, ctx.context_len)
    if error is None:
        return ids
    if ctx.allow_auto_truncate and params.max_new_tokens < ctx.context_len - 1:
        return ids[: ctx.context_len - params.max_new_tokens - 1]
    raise bad(max_tokens_param if len(ids) < ctx.context_len else param, error)


# ---- /v1/completions ----

def parse_completion(body: dict, ctx: ValidationContext) -> GenerationPlan:
    check_model(body, ctx)
    _unsupported(body, ("suffix", "best_of"))
    max_tokens = _int(body, "max_tokens", None, 0)
    grammar, grammar_param = output_grammar(body)
    params = openai_sampling(body, max_tokens, 16, ctx, grammar)
    prompts = _completion_prompts(body, ctx, params.n)
    stream = boolean(body, "stream", False)
    logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
    echo = boolean(body, "echo", False)
    prompts = [fit_context(ids, params, ctx, "prompt") for ids in prompts]
    plan = GenerationPlan(prompts, params, stream, _stream_options(body, stream), logprobs is not None,
                          logprobs or 0, single=False, grammar_param=grammar_param, echo=echo,
                          prompt_texts=_prompt_texts(body),
                          logprob_start_len=0 if echo and logprobs is not None else -1)
    return _check_constrained(plan, ctx)


def _prompt_texts(body: dict) -> list[str]:
    prompt = body["prompt"]
    texts = [prompt] if isinstance(prompt, str) else prompt
    return texts if all(isinstance(t, str) for t in texts) else []


def _completion_prompts(body: dict, ctx: ValidationContext, n: int) -> list[list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "is required")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt", "must be a non-empty string, list of strings, or list of token ids")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [_token_list(prompt, "prompt", ctx.vocab_size)]
    _check_sequences(len(prompt) * n, "n" if n > 1 else "prompt")
    if all(isinstance(p, list) for p in prompt):
        return [_token_list(p, "prompt", ctx.vocab_size) for p in prompt]
    if not all(isinstance(p, str) for p in prompt):
        raise bad("prompt", "must be a string, a list of strings, or token ids")
    if any(not p for p in prompt):
        raise bad("prompt", "must not be empty")
    return [_encode(p, ctx, "prompt") for p in prompt]


# ---- /v1/chat/completions ----

def parse_chat(body: dict, ctx: ValidationContext) -> GenerationPlan:
    check_model(body, ctx)
    _unsupported(body, ("functions",))
    grammar, grammar_param = output_grammar(body)
    tools = tool_plan(body, ctx.tool_parser)
    tag = tools.structural_tag() if tools else None
    if tag is not None:
        if grammar:
            raise bad(grammar_param, "cannot be combined with tool_choice required or a named function")
        grammar, grammar_param = {"structural_tag": tag}, "tool_choice"
    messages = _messages(body, ctx)
    max_tokens = _int(body, "max_completion_tokens", None, 0)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", None, 0)
    params = openai_sampling(body, max_tokens, 128, ctx, grammar)
    stream = boolean(body, "stream", False)
    logprobs = boolean(body, "logprobs", False)
    top_logprobs = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise bad("top_logprobs", "requires logprobs to be true")
    try:
        ids = encode_tool_chat(messages, tools, ctx.encode_chat, ctx.native_tools)
    except Exception as exc:  # a chat template may reject role orders (jinja raises its own exceptions)
        raise bad("messages", f"the chat template rejected the messages: {str(exc)[:300]}") from None
    ids = fit_context(ids, params, ctx, "messages")
    plan = GenerationPlan([ids], params, stream, _stream_options(body, stream), logprobs, top_logprobs,
                          grammar_param=grammar_param, tools=tools)
    return _check_constrained(plan, ctx)


# ---- fields /tokenize and /detokenize share with the generation endpoints ----

def prompt_text(body: dict, name: str, ctx: ValidationContext) -> str:
    text = body.get(name)
    if not isinstance(text, str):
        raise bad(name, "must be a string")
    _check_prompt_chars(len(valid_text(text, name)), ctx, name)
    return text


def chat_messages(body: dict, ctx: ValidationContext) -> list[dict]:
    return _messages(body, ctx)


def token_ids(body: dict, name: str, vocab_size: int) -> list[int]:
    value = body.get(name)
    if value == []:
        return []
    return _token_list(value, name, vocab_size)


def _messages(body: dict, ctx: ValidationContext) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of messages")
    if len(messages) >= ctx.context_len:
        raise bad("messages", f"{len(messages)} messages cannot fit the model's context of {ctx.context_len} tokens")
    parsed = [_message(m, i) for i, m in enumerate(messages)]
    _check_prompt_chars(sum(len(m["content"]) for m in parsed), ctx, "messages")
    return parsed


def _message(message: Any, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad(where, "must be an object with role and content")
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise bad(f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {shown(role)}")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise bad(f"{where}.content", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported")
        content = "".join(p["text"] for p in content)
    calls = message_calls(message, where) if role == "assistant" else None
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise bad(f"{where}.content", "must be a string or a list of text parts")
    parsed = {"role": "system" if role == "developer" else role, "content": valid_text(content, f"{where}.content")}
    if calls:
        parsed["tool_calls"] = calls
    if role == "tool" and isinstance(message.get("tool_call_id"), str):
        parsed["tool_call_id"] = message["tool_call_id"]
    return parsed


# ---- /generate (SGLang native) ----

def parse_generate(body: dict, ctx: ValidationContext) -> GenerationPlan:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise bad("text", "pass exactly one of text or input_ids")
    prompt_param = "text" if text is not None else "input_ids"
    count = len(text) if isinstance(text, list) else len(input_ids) if _is_batch(input_ids) else 1
    _check_sequences(count, prompt_param)
    per_prompt = _native_sampling(body.get("sampling_params"), count)
    _check_sequences(sum(p.n for p in per_prompt), "sampling_params.n")
    prompts, single = _native_prompts(text, input_ids, ctx)
    stream = boolean(body, "stream", False)
    return_logprob = boolean(body, "return_logprob", False)
    top = _int(body, "top_logprobs_num", 0, 0, MAX_LOGPROBS) or 0
    start = _int(body, "logprob_start_len", -1, -1)
    if start >= 0 and not return_logprob:
        raise bad("logprob_start_len", "requires return_logprob to be true")
    prompts = [fit_context(ids, p, ctx, prompt_param, "sampling_params.max_new_tokens")
               for ids, p in zip(prompts, per_prompt)]
    if stream and not single:
        raise bad("stream", "streaming is supported for a single prompt only")
    for p in per_prompt:
        bias_error = logit_bias_error(p, ctx.vocab_size)
        if bias_error is not None:
            raise bad("sampling_params.logit_bias", bias_error)
    grammar = next((p.grammar for p in per_prompt if p.grammar is not None), None)
    plan = GenerationPlan(prompts, per_prompt[0], stream, False, return_logprob, top, single, per_prompt,
                          grammar_param=f"sampling_params.{grammar.kind}" if grammar else None,
                          logprob_start_len=start)
    return _check_constrained(plan, ctx)


def _is_batch(input_ids: Any) -> bool:
    return isinstance(input_ids, list) and bool(input_ids) and all(isinstance(x, list) for x in input_ids)


def _native_prompts(text: Any, input_ids: Any, ctx: ValidationContext) -> tuple[list[list[int]], bool]:
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise bad("text", "must be a non-empty string or a list of non-empty strings")
        return [_encode(t, ctx, "text") for t in texts], isinstance(text, str)
    if _is_batch(input_ids):
        return [_token_list(ids, "input_ids", ctx.vocab_size) for ids in input_ids], False
    return [_token_list(input_ids, "input_ids", ctx.vocab_size)], True


def _native_sampling(raw: Any, count: int) -> list[SamplingParams]:
    if raw is None:
        raw = {}
    if not isinstance(raw, (dict, list)) or (isinstance(raw, list) and len(raw) != count):
        raise bad("sampling_params", f"must be an object or a list of {count} objects")
    items = raw if isinstance(raw, list) else [raw] * count
    if not all(isinstance(i, dict) for i in items):
        raise bad("sampling_params", f"must be an object or a list of {count} objects")
    try:
        return [SamplingParams.from_dict(item) for item in items]
    except SamplingParamsError as exc:
        raise bad(f"sampling_params.{exc.param}", str(exc)) from None
    except TypeError as exc:
        raise bad("sampling_params", str(exc)) from None
