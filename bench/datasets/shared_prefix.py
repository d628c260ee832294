"""`generated-shared-prefix`: groups of prompts that share a long system prompt and differ in a short question."""
from __future__ import annotations

import numpy as np

from toolkit.bench.datasets.base import DatasetSpec, Prompt, cycle_to
from toolkit.bench.datasets.vocab import pool_for


def sample(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    pool, rng = pool_for(tokenizer), np.random.default_rng(spec.seed)
    systems = [pool.draw(rng, spec.gsp_system_prompt_len) for _ in range(spec.gsp_num_groups)]
    draws = [
        np.concatenate((system, pool.draw(rng, spec.gsp_question_len)))
        for system in systems
        for _ in range(spec.gsp_prompts_per_group)
    ]
    # NOTE: shuffled so that a group's prompts arrive spread over the run, as SGLang's bench_serving sends them.
    order = rng.permutation(len(draws))
    draws = cycle_to([draws[k] for k in order], count or len(draws))
    length = spec.gsp_system_prompt_len + spec.gsp_question_len
    texts = pool.fit([pool.text_of(d) for d in draws], [length] * len(draws))
    return [
        Prompt(text=t, input_len=length, output_len=spec.gsp_output_len, input_ids=pool.ids_of(d))
        for t, d in zip(texts, draws)
    ]
