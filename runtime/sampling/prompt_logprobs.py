"""The prompt's own logprobs (`echo` with `logprobs`; SGLang's `logprob_start_len`, vLLM's `prompt_logprobs`).

An extend that scores prompt tokens returns logits for more than each request's last position (`logit_counts`);
the row of position q scores prompt token q + 1 as the model's raw distribution, log_softmax of its logits in
float32 (no penalty, bias or temperature: nothing was sampled there).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.runtime.io_struct import LogprobEntry


@dataclass
class PromptRows:
    """Which logits rows of an extend score which prompt tokens."""

    rows: torch.Tensor  # [n] rows of the extend's logits
    targets: torch.Tensor  # [n] the prompt token that follows each row's position
    top_logprobs_num: int = 0


@dataclass
class PromptScores:
    """A `PromptRows`' logprobs, on the device until the scheduler reads them."""

    logprobs: torch.Tensor  # [n]
    top_values: torch.Tensor | None = None  # [n, top_logprobs_num]
    top_indices: torch.Tensor | None = None

    def to_host(self) -> list[tuple[float, list[tuple[int, float]] | None]]:
        logprobs = self.logprobs.tolist()
        if self.top_values is None:
            return [(lp, None) for lp in logprobs]
        tops = [list(zip(ids, values)) for ids, values in zip(self.top_indices.tolist(), self.top_values.tolist())]
        return list(zip(logprobs, tops))


def score(logits: torch.Tensor, prompt: PromptRows) -> PromptScores:
    logprobs = torch.log_softmax(logits[prompt.rows].float(), dim=-1)
    scores = PromptScores(logprobs.gather(1, prompt.targets.view(-1, 1)).squeeze(1))
    if prompt.top_logprobs_num > 0:
        scores.top_values, scores.top_indices = logprobs.topk(prompt.top_logprobs_num, dim=-1)
    return scores


@dataclass
class PromptSpan:
    """One request's share of a `PromptRows`, in row order: the prompt positions `first`..`first + count - 1`."""

    req: object  # the scheduler's Req
    first: int
    count: int


def entries(tokens: list[int], first: int, scores: list[tuple[float, list[tuple[int, float]] | None]],
            top_logprobs_num: int) -> list[LogprobEntry]:
    """Log entries of prompt tokens `first`.. from their host scores (top alternatives cut to the request's)."""
    return [(tokens[first + i], lp, top[:top_logprobs_num] if top is not None and top_logprobs_num else None)
            for i, (lp, top) in enumerate(scores)]
