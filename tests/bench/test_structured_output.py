"""The structured-output workload: `--json-schema FILE` constrains every request in each dialect's own words, a
custom dataset row's `json_schema` constrains its own request, and a bad schema file is a usage error."""
from __future__ import annotations

import json

import pytest

from toolkit.bench.backends import RequestOptions, request_body
from toolkit.bench.datasets.base import DatasetSpec, Prompt
from toolkit.bench.datasets.custom import sample
from toolkit.bench.options import UsageError, parse_json_schema
from toolkit.runtime.model_loader.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
OWN = {"type": "array", "items": {"type": "string"}}


def _body(backend: str, prompt: Prompt, schema: dict | None) -> dict:
    opts = RequestOptions(backend, "m", json_schema=json.dumps(schema) if schema else None)
    return json.loads(request_body(prompt, opts))


def test_every_dialect_carries_the_schema():
    prompt = Prompt("Hi", 1, 8)
    assert json.loads(_body("sglang", prompt, SCHEMA)["sampling_params"]["json_schema"]) == SCHEMA
    for backend in ("openai", "openai-chat"):
        fmt = _body(backend, prompt, SCHEMA)["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == SCHEMA and fmt["json_schema"]["strict"]
    assert "json_schema" not in _body("sglang", prompt, None)["sampling_params"]
    assert "response_format" not in _body("openai", prompt, None)


def test_a_rows_own_schema_wins(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "List fruit", "output_len": 16, "json_schema": OWN}) + "\n"
                    + json.dumps({"prompt": "Say hi", "output_len": 4}) + "\n")
    prompts = sample(DatasetSpec(name="custom", path=path), load_tokenizer(None), None)
    assert json.loads(prompts[0].json_schema) == OWN and prompts[1].json_schema is None
    assert json.loads(_body("sglang", prompts[0], SCHEMA)["sampling_params"]["json_schema"]) == OWN
    assert json.loads(_body("sglang", prompts[1], SCHEMA)["sampling_params"]["json_schema"]) == SCHEMA


def test_a_bad_schema_file_is_a_usage_error(tmp_path):
    assert json.loads(parse_json_schema(_write(tmp_path, json.dumps(SCHEMA)))) == SCHEMA
    for text in ("{not json", "[1, 2]"):
        with pytest.raises(UsageError, match="--json-schema"):
            parse_json_schema(_write(tmp_path, text))
    with pytest.raises(UsageError, match="--json-schema"):
        parse_json_schema(tmp_path / "missing.json")


def _write(folder, text: str):
    path = folder / "schema.json"
    path.write_text(text)
    return path
