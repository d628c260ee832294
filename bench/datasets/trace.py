"""`trace`: replay of recorded arrivals and lengths (Azure LLM 2023 CSV or Mooncake-style JSONL)."""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import NamedTuple

import numpy as np

from toolkit.bench.datasets.base import DEFAULT_NUM_PROMPTS, DatasetError, DatasetSpec, Prompt, cycle_to
from toolkit.bench.datasets.vocab import WordPool, pool_for

# NOTE: the traces ship inside the package (toolkit.traces), so an installed wheel replays them from anywhere.
DEFAULT_TRACE = Path(str(files("toolkit.traces") / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"))
MOONCAKE_BLOCK_TOKENS = 512
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class Trace(NamedTuple):
    """Arrival offsets in seconds from the first request, token lengths, and prefix-block hash ids (or None)."""

    offsets: np.ndarray
    input_lens: np.ndarray
    output_lens: np.ndarray
    hash_ids: list[list[int]] | None

    def head(self, count: int) -> Trace:
        return Trace(
            self.offsets[:count], self.input_lens[:count], self.output_lens[:count],
            None if self.hash_ids is None else self.hash_ids[:count],
        )


def _read_azure(path: Path) -> Trace:
    import pandas as pd

    frame = pd.read_csv(path)
    if not set(_AZURE_COLUMNS) <= set(frame.columns):
        raise DatasetError(f"{path}: an Azure trace CSV needs the columns {', '.join(_AZURE_COLUMNS)}")
    stamps = pd.to_datetime(frame["TIMESTAMP"], format="mixed")
    offsets = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
    return Trace(offsets, frame["ContextTokens"].to_numpy(), frame["GeneratedTokens"].to_numpy(), None)


def _read_mooncake(path: Path) -> Trace:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    rows.append((float(row["timestamp"]), int(row["input_length"]), int(row["output_length"]),
                                 [int(h) for h in row.get("hash_ids", [])]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    raise DatasetError(f"{path}:{number}: not a Mooncake trace row ({exc!r})") from None
    if not rows:
        raise DatasetError(f"{path}: no requests")
    stamps_ms = np.array([r[0] for r in rows])
    return Trace((stamps_ms - stamps_ms[0]) / 1000.0, np.array([r[1] for r in rows]),
                 np.array([r[2] for r in rows]), [r[3] for r in rows])


def read_trace(path: Path | None, time_scale: float = 1.0) -> Trace:
    """The trace at `path` (the Azure conversation trace when None), arrivals stretched by `time_scale`."""
    path = path or DEFAULT_TRACE
    if not path.is_file():
        raise DatasetError(f"--dataset-path {path}: no such file")
    trace = _read_azure(path) if path.suffix == ".csv" else _read_mooncake(path)
    if np.any(np.diff(trace.offsets) < 0):
        raise DatasetError(f"{path}: timestamps must not decrease")
    lens = (np.maximum(trace.input_lens, 1), np.maximum(trace.output_lens, 1))
    return Trace(trace.offsets * time_scale, *lens, trace.hash_ids)


def _block_positions(pool: WordPool, seed: int, hash_id: int) -> np.ndarray:
    # NOTE: a block's tokens depend only on its hash id, so equal hash ids give an identical shared prefix.
    return pool.draw(np.random.default_rng([seed, hash_id]), MOONCAKE_BLOCK_TOKENS)


def _positions(pool: WordPool, rng: np.random.Generator, seed: int, length: int, hash_ids: list[int] | None):
    blocks = [_block_positions(pool, seed, h) for h in hash_ids or []]
    blocks.append(pool.draw(rng, max(0, length - MOONCAKE_BLOCK_TOKENS * len(blocks))))
    return np.concatenate(blocks)[:length]


def prompts_for(trace: Trace, tokenizer, seed: int) -> list[Prompt]:
    pool, rng = pool_for(tokenizer), np.random.default_rng(seed)
    hash_ids = trace.hash_ids or [None] * len(trace.offsets)
    draws = [_positions(pool, rng, seed, int(n), h) for n, h in zip(trace.input_lens, hash_ids)]
    texts = pool.fit([pool.text_of(d) for d in draws], [int(n) for n in trace.input_lens])
    return [
        Prompt(text=t, input_len=int(n), output_len=int(m), input_ids=pool.ids_of(d))
        for t, n, m, d in zip(texts, trace.input_lens, trace.output_lens, draws)
    ]


def window(trace: Trace, count: int | None, duration: float | None) -> Trace:
    """The first `count` requests, or those arriving within `duration` seconds."""
    if duration is not None:
        return trace.head(int(np.searchsorted(trace.offsets, duration, side="left")))
    return trace.head(count or DEFAULT_NUM_PROMPTS)


def sample(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    """Lengths (and shared prefixes) of the trace's first `count` requests, for a synthetic arrival process."""
    trace = window(read_trace(spec.path, spec.trace_time_scale), count, None)
    return cycle_to(prompts_for(trace, tokenizer, spec.seed), count or len(trace.offsets))
