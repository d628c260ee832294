"""`sharegpt`: real conversations from a ShareGPT-format JSON file the user gives; nothing is downloaded."""
from __future__ import annotations

import json

import numpy as np

from toolkit.bench.datasets.base import DEFAULT_NUM_PROMPTS, DatasetError, DatasetSpec, Prompt, cycle_to, require_file

_MIN_TOKENS = 2
_BATCH = 512


def _first_exchange(conversation: dict) -> tuple[str, str] | None:
    turns = conversation.get("conversations") or conversation.get("conversation") or []
    if len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
        return None
    prompt, reply = (t.get("value", t.get("content")) for t in turns[:2])
    return (prompt, reply) if isinstance(prompt, str) and isinstance(reply, str) else None


def read_exchanges(path) -> list[tuple[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a ShareGPT JSON file ({exc})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} objects")
    return [pair for item in data if isinstance(item, dict) and (pair := _first_exchange(item))]


def to_prompts(pairs: list[tuple[str, str]], tokenizer, output_len: int | None, limit: int) -> list[Prompt]:
    """Up to `limit` prompts measured with the tokenizer, skipping exchanges too short to time."""
    prompts: list[Prompt] = []
    for start in range(0, len(pairs), _BATCH):
        if len(prompts) >= limit:
            break
        chunk = pairs[start : start + _BATCH]
        prompt_ids = tokenizer([p for p, _ in chunk], add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer([r for _, r in chunk], add_special_tokens=False)["input_ids"]
        for (text, _), p_ids, r_ids in zip(chunk, prompt_ids, reply_ids):
            out = output_len or len(r_ids)
            if len(p_ids) >= _MIN_TOKENS and out >= _MIN_TOKENS:
                prompts.append(Prompt(text=text, input_len=len(p_ids), output_len=out))
    return prompts[:limit]


def sample(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    pairs = read_exchanges(require_file(spec.path, "sharegpt"))
    if not pairs:
        raise DatasetError(f"{spec.path}: no conversation with a prompt and a reply")
    count = count or DEFAULT_NUM_PROMPTS
    order = np.random.default_rng(spec.seed).permutation(len(pairs))
    shuffled = [pairs[k] for k in order]
    return cycle_to(to_prompts(shuffled, tokenizer, spec.sharegpt_output_len, count), count)
