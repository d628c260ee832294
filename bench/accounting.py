"""Per-token accounting of a streamed response: how many tokens each event carried, summing to the true total."""
from __future__ import annotations

from toolkit.bench.backends import StreamTokens


def reconcile(estimates: list[int], total: int) -> list[int]:
    """Integer counts proportional to `estimates` that sum to `total` (largest-remainder rounding)."""
    if not estimates or sum(estimates) == total:
        return list(estimates)
    scale = total / sum(estimates)
    shares = [e * scale for e in estimates]
    counts = [int(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _estimate(texts: list[str], tokenizer) -> list[int]:
    if tokenizer is None:
        return [1] * len(texts)
    return [max(1, len(ids)) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def token_counts(tokens: StreamTokens, tokenizer) -> tuple[list[int], int]:
    """(tokens per event, output tokens). The server's counts win; the tokenizer fills in what it did not say."""
    if all(c is not None for c in tokens.counts):
        counts = list(tokens.counts)
        return counts, tokens.completion_tokens if tokens.completion_tokens is not None else sum(counts)
    if not tokens.texts:
        return [], tokens.completion_tokens or 0
    estimates = _estimate(tokens.texts, tokenizer)
    total = tokens.completion_tokens
    if total is None:
        total = sum(_estimate(["".join(tokens.texts)], tokenizer)) if tokenizer is not None else sum(estimates)
    return reconcile(estimates, total), total
