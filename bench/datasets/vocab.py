"""Synthetic prompt text that re-tokenizes to exactly the intended number of tokens."""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from toolkit.bench.datasets.base import DatasetError

_WORD = re.compile(r"^[\u0120\u2581][A-Za-z]{2,}$")
_MAX_CANDIDATES = 8192
_MIN_POOL = 256
_FIT_ROUNDS = 4


class WordPool:
    """Vocabulary entries that are one space-led word each, so a run of them encodes to one token per word."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        ids, words = _single_token_words(tokenizer)
        if len(ids) < _MIN_POOL:
            raise DatasetError("the tokenizer has too few single-token words to synthesize prompts; pass --tokenizer")
        self.ids = np.asarray(ids, dtype=np.int64)
        self.words = np.asarray(words, dtype=object)
        self.concatenates_exactly = _concatenates_exactly(tokenizer, ids, words)

    def draw(self, rng: np.random.Generator, length: int) -> np.ndarray:
        """Positions in the pool for a prompt of `length` tokens."""
        return rng.integers(0, len(self.ids), size=length)

    def ids_of(self, positions: np.ndarray) -> list[int]:
        return self.ids[positions].tolist()

    def text_of(self, positions: np.ndarray) -> str:
        return "".join(self.words[positions])

    def fit(self, texts: list[str], lengths: list[int]) -> list[str]:
        """The texts, each corrected where needed so that it encodes to its length in tokens."""
        if self.concatenates_exactly:
            return texts
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [t if len(e) == n else self._refit(t, n) for t, e, n in zip(texts, encoded, lengths)]

    def _refit(self, text: str, length: int) -> str:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        for _ in range(_FIT_ROUNDS):
            if len(ids) > length:
                text = self.tokenizer.decode(ids[:length])
            elif len(ids) < length:
                text += "".join(self.words[: length - len(ids)])
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == length:
                break
        return text


def _single_token_words(tokenizer) -> tuple[list[int], list[str]]:
    vocab = tokenizer.get_vocab()
    candidates = sorted((i, " " + tok[1:]) for tok, i in vocab.items() if _WORD.match(tok))
    if len(candidates) > _MAX_CANDIDATES:
        keep = np.random.default_rng(0).choice(len(candidates), _MAX_CANDIDATES, replace=False)
        candidates = [candidates[k] for k in sorted(keep)]
    encoded = tokenizer([w for _, w in candidates], add_special_tokens=False)["input_ids"]
    pairs = [(i, w) for (i, w), e in zip(candidates, encoded) if e == [i]]
    return [i for i, _ in pairs], [w for _, w in pairs]


def _concatenates_exactly(tokenizer, ids: list[int], words: list[str]) -> bool:
    """Whether any run of pool words encodes to its ids, checked on the whole pool in two orders."""
    order = np.random.default_rng(0).permutation(len(ids))
    for sequence in (range(len(ids)), order):
        text = "".join(words[k] for k in sequence)
        if tokenizer.encode(text, add_special_tokens=False) != [ids[k] for k in sequence]:
            return False
    return True


@lru_cache(maxsize=4)
def pool_for(tokenizer) -> WordPool:
    return WordPool(tokenizer)
