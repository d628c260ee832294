"""Batched next-token choice: penalties, temperature, top-k/top-p/min-p, per-request seeds, logprobs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.runtime.sampling.sampling_params import SamplingParams


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class TokenHistory:
    prompt_ids: list[int]
    output_ids: list[int]


class Sampler:
    def __init__(self, device: torch.device | str) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}

    def seeded_generator(self, rid: str, seed: int) -> torch.Generator:
        """One generator per request, so a seeded request samples the same tokens in any batch."""
        if rid not in self._generators:
            self._generators[rid] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[rid]

    def forget(self, rid: str) -> None:
        self._generators.pop(rid, None)

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        rids: list[str],
        histories: list[TokenHistory],
        top_logprobs_num: int = 0,
        return_logprob: bool = False,
    ) -> SampleOutput:
        logits = apply_penalties(logits, params, histories)
        greedy = [p.is_greedy for p in params]
        if all(greedy):
            token_ids = logits.argmax(dim=-1)
            logprobs = torch.log_softmax(logits, dim=-1) if return_logprob else None
        else:
            probs = torch.softmax(logits / _column([max(p.temperature, 1e-6) for p in params], logits), dim=-1)
            token_ids = self._sample_from(probs, params, rids)
            token_ids = torch.where(torch.tensor(greedy, device=logits.device), logits.argmax(dim=-1), token_ids)
            logprobs = torch.log(probs).clamp(min=torch.finfo(probs.dtype).min) if return_logprob else None
        chosen = token_ids.tolist()
        if logprobs is None:
            return SampleOutput(chosen)
        picked = logprobs.gather(1, token_ids.view(-1, 1)).squeeze(1).tolist()
        top = None
        if top_logprobs_num > 0:
            values, indices = logprobs.topk(top_logprobs_num, dim=-1)
            top = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        return SampleOutput(chosen, picked, top)

    def _sample_from(self, probs: torch.Tensor, params: list[SamplingParams], rids: list[str]) -> torch.Tensor:
        """Inverse-CDF sampling: one uniform per row (from the request's own generator when it has a seed)."""
        probs = filter_probs(probs, params)
        uniforms = torch.rand(probs.shape[0], 1, device=probs.device, dtype=torch.float64)
        for i, p in enumerate(params):
            if p.seed is not None:
                generator = self.seeded_generator(rids[i], p.seed)
                uniforms[i, 0] = torch.rand(1, generator=generator, device=probs.device, dtype=torch.float64)[0]
        cdf = probs.to(torch.float64).cumsum(dim=-1)
        chosen = torch.searchsorted(cdf, uniforms * cdf[:, -1:], right=True).squeeze(1)
        return chosen.clamp_(max=probs.shape[-1] - 1)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, 1)


def filter_probs(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero out tokens outside top-k, outside the top-p nucleus, and below min_p × the top probability."""
    if any(p.min_p > 0 for p in params):
        threshold = probs.amax(dim=-1, keepdim=True) * _column([p.min_p for p in params], probs)
        probs = probs.masked_fill(probs < threshold, 0.0)
    if not any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        return probs
    vocab = probs.shape[-1]
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=probs.device)
    sorted_probs[torch.arange(vocab, device=probs.device).view(1, -1) >= top_k.view(-1, 1)] = 0.0
    sorted_probs[(cumulative - sorted_probs) > _column([p.top_p for p in params], probs)] = 0.0
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs)


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[TokenHistory]
) -> torch.Tensor:
    """Frequency/presence penalties count generated tokens; the repetition penalty also counts the prompt."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i in rows:
        p, history = params[i], histories[i]
        generated = torch.tensor(history.output_ids, dtype=torch.int64, device=logits.device)
        counts = torch.bincount(generated, minlength=vocab)[:vocab].to(logits.dtype)
        logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        if p.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            seen[torch.tensor(history.prompt_ids + history.output_ids, dtype=torch.int64, device=logits.device)] = True
            row = logits[i]
            penalized = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
            logits[i] = torch.where(seen, penalized, row)
    return logits
