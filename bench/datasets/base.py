"""What every dataset yields: prompts with their token lengths, and the options that shape them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class DatasetError(ValueError):
    """A dataset cannot be built from the given options or file; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input. `input_ids` is set for synthetic prompts, so the native backend can send ids."""

    text: str
    input_len: int
    output_len: int
    input_ids: list[int] | None = None
    json_schema: str | None = None  # the output must match this JSON schema (its text), when set


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    name: str = "random"
    path: Path | None = None
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 1024
    random_range_ratio: float = 0.0
    gsp_num_groups: int = 64
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 2048
    gsp_question_len: int = 128
    gsp_output_len: int = 256
    sharegpt_output_len: int | None = None
    trace_time_scale: float = 1.0

    @property
    def synthetic(self) -> bool:
        return self.name in ("random", "generated-shared-prefix", "trace")


DEFAULT_NUM_PROMPTS = 1000


def cycle_to(items: list, count: int) -> list:
    """`count` items taken in order, starting over when the list runs out."""
    if not items:
        raise DatasetError("the dataset has no usable rows")
    return [items[i % len(items)] for i in range(count)]


def require_file(path: Path | None, dataset: str) -> Path:
    if path is None:
        raise DatasetError(f"--dataset {dataset} needs --dataset-path FILE")
    if not path.is_file():
        raise DatasetError(f"--dataset-path {path}: no such file")
    return path
