"""The fields that constrain an OpenAI body's output: `response_format` (text, json_object, json_schema with
`strict`), SGLang's extras `json_schema`, `regex` and `ebnf`, and `logit_bias`; each becomes sampling parameters,
with the field a grammar error will name."""
from __future__ import annotations

import json
from typing import Any

from toolkit.runtime.constrained.spec import JSON_OBJECT_SCHEMA
from toolkit.runtime.sampling.sampling_params import shown
from toolkit.runtime.server.request_fields import bad, boolean

SGLANG_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")  # SGLang's extra constraint fields of an OpenAI body


def logit_bias(body: dict, vocab_size: int) -> dict[str, float] | None:
    """OpenAI's `logit_bias`: token ids (as JSON keys) to a bias in [-100, 100]."""
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise bad("logit_bias", "must be an object mapping token ids to biases")
    for token in bias:
        if not (token.isascii() and token.isdigit() and len(token) <= 12 and int(token) < vocab_size):
            raise bad("logit_bias", f"{shown(token)} is not a token id in [0, {vocab_size})")
    return bias


def _grammar_fields(body: dict, names: tuple[str, ...], param: str) -> tuple[dict[str, Any], str | None]:
    """SGLang's extra fields (`json_schema`, `regex`, `ebnf`) of an OpenAI body: the sampling fields and the
    param that names them."""
    given = {name: body[name] for name in names if body.get(name) is not None}
    if len(given) > 1:
        raise bad(sorted(given)[1], f"only one of {', '.join(names)} may be given")
    if not given:
        return {}, None
    (name, value), = given.items()
    if name == "json_schema" and isinstance(value, (dict, bool)):
        value = json.dumps(value)
    if not isinstance(value, str) or not value:
        raise bad(name, "must be a non-empty string")
    return {name: value}, f"{param}{name}"


def _response_format(body: dict) -> tuple[dict[str, Any], str | None]:
    """OpenAI's `response_format`: text, json_object (any JSON object) or json_schema (with `strict`)."""
    fmt = body.get("response_format")
    if fmt is None:
        return {}, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}, None
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}, "response_format"
    if kind != "json_schema":
        raise bad("response_format", "type must be one of text, json_object, json_schema")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise bad("response_format.json_schema", "must be an object with a `schema` object (and `name`, `strict`)")
    strict = boolean(spec, "strict", False)
    schema = spec.get("schema", {})
    return {"json_schema": json.dumps(schema), "json_schema_strict": strict}, "response_format.json_schema"


def output_grammar(body: dict) -> tuple[dict[str, Any], str | None]:
    fields, param = _response_format(body)
    extra, extra_param = _grammar_fields(body, SGLANG_GRAMMAR_FIELDS, "")
    if fields and extra:
        raise bad(extra_param, "cannot be combined with response_format")
    return (fields, param) if fields else (extra, extra_param)
