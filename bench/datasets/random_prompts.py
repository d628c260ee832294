"""`random`: prompts of random tokens with lengths drawn from SGLang's `[r·L, L]` range."""
from __future__ import annotations

import numpy as np

from toolkit.bench.datasets.base import DEFAULT_NUM_PROMPTS, DatasetSpec, Prompt
from toolkit.bench.datasets.vocab import WordPool, pool_for


def lengths(rng: np.random.Generator, length: int, range_ratio: float, count: int) -> np.ndarray:
    """Token lengths uniform on `[max(int(L·r), 1), L]`, as SGLang's bench_serving draws them."""
    return rng.integers(max(int(length * range_ratio), 1), length + 1, size=count)


def synthesize(pool: WordPool, rng: np.random.Generator, input_lens, output_lens) -> list[Prompt]:
    draws = [pool.draw(rng, int(n)) for n in input_lens]
    texts = pool.fit([pool.text_of(d) for d in draws], [int(n) for n in input_lens])
    return [
        Prompt(text=t, input_len=int(n), output_len=int(m), input_ids=pool.ids_of(d))
        for t, n, m, d in zip(texts, input_lens, output_lens, draws)
    ]


def sample(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    rng, count = np.random.default_rng(spec.seed), count or DEFAULT_NUM_PROMPTS
    input_lens = lengths(rng, spec.random_input_len, spec.random_range_ratio, count)
    output_lens = lengths(rng, spec.random_output_len, spec.random_range_ratio, count)
    return synthesize(pool_for(tokenizer), rng, input_lens, output_lens)
