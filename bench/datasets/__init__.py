"""Datasets by name: each turns a `DatasetSpec` and a tokenizer into prompts with exact token lengths."""
from __future__ import annotations

from toolkit.bench.datasets import custom, random_prompts, shared_prefix, sharegpt, trace
from toolkit.bench.datasets.base import DatasetError, DatasetSpec, Prompt

_SAMPLERS = {
    "random": random_prompts.sample,
    "generated-shared-prefix": shared_prefix.sample,
    "sharegpt": sharegpt.sample,
    "custom": custom.sample,
    "trace": trace.sample,
}
DATASETS: tuple[str, ...] = tuple(_SAMPLERS)


def build_prompts(spec: DatasetSpec, tokenizer, count: int | None) -> list[Prompt]:
    """`count` prompts (the dataset's own default when None)."""
    if spec.name not in _SAMPLERS:
        raise DatasetError(f"unknown dataset {spec.name!r}; choose one of {', '.join(DATASETS)}")
    return _SAMPLERS[spec.name](spec, tokenizer, count)


__all__ = ["DATASETS", "DatasetError", "DatasetSpec", "Prompt", "build_prompts"]
