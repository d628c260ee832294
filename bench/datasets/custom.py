"""`custom`: a JSONL file, one request a line: `{"prompt", "output_len"}` or a `messages`/`conversations` list,
with an optional `json_schema` (an object) its output must match (a structured-output workload)."""
from __future__ import annotations

import json
from typing import NamedTuple

from toolkit.bench.datasets.base import DatasetError, DatasetSpec, Prompt, cycle_to, require_file

_USER_ROLES = ("user", "human")
_REPLY_ROLES = ("assistant", "gpt")


def _turn_text(turns: list, roles: tuple[str, ...]) -> str | None:
    for turn in turns:
        if isinstance(turn, dict) and turn.get("role", turn.get("from")) in roles:
            text = turn.get("content", turn.get("value"))
            return text if isinstance(text, str) else None
    return None


class Row(NamedTuple):
    prompt: str
    output_len: int | None  # explicit, or None
    reply: str | None  # the reference reply's text, or None
    json_schema: str | None = None


def _schema(row: dict, where: str) -> str | None:
    schema = row.get("json_schema")
    if schema is None:
        return None
    if not isinstance(schema, (dict, bool)):
        raise DatasetError(f"{where}: json_schema must be a JSON schema object")
    return json.dumps(schema)


def _parse_row(row: dict, where: str) -> Row:
    output_len = row.get("output_len", row.get("max_tokens"))
    if output_len is not None and (not isinstance(output_len, int) or output_len < 1):
        raise DatasetError(f"{where}: output_len must be a positive integer")
    if isinstance(row.get("prompt"), str):
        return Row(row["prompt"], output_len, None, _schema(row, where))
    turns = row.get("messages", row.get("conversations"))
    prompt = _turn_text(turns, _USER_ROLES) if isinstance(turns, list) else None
    if prompt is None:
        raise DatasetError(f"{where}: needs a string 'prompt' or a 'messages' list with a user turn")
    return Row(prompt, output_len, _turn_text(turns, _REPLY_ROLES), _schema(row, where))


def read_rows(path) -> list[Row]:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: each line must be a JSON object")
            rows.append(_parse_row(row, f"{path}:{number}"))
    return rows


def _output_len(row: Row, tokenizer, override: int | None, where: str) -> int:
    explicit, reply = row.output_len, row.reply
    if override or explicit:
        return override or explicit
    if reply is None:
        raise DatasetError(f"{where}: no output length; add 'output_len' or pass --sharegpt-output-len")
    return max(1, len(tokenizer.encode(reply, add_special_tokens=False)))


def sample(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    """The file's requests in order (all of them when `count` is None), repeated if `count` asks for more."""
    path = require_file(spec.path, "custom")
    rows = read_rows(path)
    if not rows:
        raise DatasetError(f"{path}: no requests")
    input_ids = tokenizer([row.prompt for row in rows], add_special_tokens=False)["input_ids"]
    override = spec.sharegpt_output_len
    prompts = [
        Prompt(text=row.prompt, input_len=len(ids), output_len=_output_len(row, tokenizer, override, f"{path} row {n}"),
               json_schema=row.json_schema)
        for n, (row, ids) in enumerate(zip(rows, input_ids), 1)
    ]
    return cycle_to(prompts, count or len(prompts))
