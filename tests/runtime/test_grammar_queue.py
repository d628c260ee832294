"""The grammar queue and the per-step mask, with a stand-in engine: each grammar compiles once (cached by kind, text
and strictness), a refusal is remembered, a compile past the bound is refused and does not hold up the grammars
behind it; the batch mask and logit_bias change their own rows only."""
from __future__ import annotations

import threading
import time

import torch

from toolkit.runtime.constrained.backend import GrammarBackend, GrammarError, RequestGrammar
from toolkit.runtime.constrained.bitmask import batch_mask
from toolkit.runtime.constrained.grammar_queue import GrammarQueue
from toolkit.runtime.constrained.spec import GrammarSpec
from toolkit.runtime.sampling.sampler import Sampler, SamplingBatch
from toolkit.runtime.sampling.sampling_params import SamplingParams

VOCAB = 8


class _Allow(RequestGrammar):
    """Allows the token ids in its grammar's text ("3,5")."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed

    def accept(self, token: int) -> bool:
        return token in self.allowed

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = False
        bitmask[row, self.allowed] = True

    @property
    def is_terminated(self) -> bool:
        return False


class FakeBackend(GrammarBackend):
    def __init__(self, block: threading.Event | None = None) -> None:
        self.compiled: list[str] = []
        self.block = block or threading.Event()

    def compile(self, spec: GrammarSpec):
        if spec.text in ("slow", "3,5"):
            self.block.wait(30)
        self.compiled.append(spec.text)
        if spec.text == "bad":
            raise GrammarError("invalid regex: bad")
        return [int(t) for t in spec.text.split(",")] if spec.text != "slow" else [0]

    def matcher(self, compiled) -> RequestGrammar:
        return _Allow(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return torch.ones(rows, VOCAB, dtype=torch.bool)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        for row in rows:
            logits[row].masked_fill_(~bitmask[row], float("-inf"))


def _settled(queue: GrammarQueue, count: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    out = []
    while len(out) < count and time.monotonic() < deadline:
        out += queue.ready()
        queue.wait(0.01)
    return out


def test_a_grammar_compiles_once_and_later_requests_get_it_at_once():
    backend = FakeBackend()
    queue = GrammarQueue(backend, timeout_s=10)
    spec = GrammarSpec("regex", "3,5")
    assert queue.submit("a", spec) is None and queue.submit("b", spec) is None
    backend.block.set()
    resolved = _settled(queue, 2)
    assert [r.rid for r in resolved] == ["a", "b"] and all(r.grammar and r.error is None for r in resolved)
    assert isinstance(queue.submit("c", spec), _Allow)
    assert backend.compiled == ["3,5"] and (queue.misses, queue.hits) == (1, 2)
    assert queue.submit("d", GrammarSpec("json_schema", "3,5", strict=False)) is None  # another key
    queue.close()


def test_a_refused_grammar_is_remembered():
    backend = FakeBackend()
    queue = GrammarQueue(backend, timeout_s=10)
    queue.submit("a", GrammarSpec("regex", "bad"))
    (first,) = _settled(queue, 1)
    queue.submit("b", GrammarSpec("regex", "bad"))
    (second,) = queue.ready()
    assert first.error == second.error == "invalid regex: bad"
    assert backend.compiled == ["bad"]
    queue.close()


def test_a_compile_past_the_bound_is_refused_and_the_ones_behind_it_go_on():
    release = threading.Event()
    backend = FakeBackend(block=release)
    queue = GrammarQueue(backend, timeout_s=0.2)
    try:
        queue.submit("slow", GrammarSpec("regex", "slow"))
        queue.submit("next", GrammarSpec("regex", "1"))
        resolved = {r.rid: r for r in _settled(queue, 2, timeout=5)}
        assert "--grammar-compile-timeout" in resolved["slow"].error
        assert resolved["next"].error is None and resolved["next"].grammar is not None
        queue.submit("again", GrammarSpec("regex", "slow"))
        (again,) = queue.ready()
        assert "took longer than 0.2 s" in again.error
    finally:
        release.set()
        queue.close()


def test_the_batch_mask_and_logit_bias_change_only_their_rows():
    backend = FakeBackend()
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    free = logits[1].clone()
    batch = SamplingBatch.greedy(3, "cpu")
    batch.vocab_mask = batch_mask(backend, [_Allow([3, 5]), None, _Allow([6])], torch.device("cpu"))
    tokens = Sampler("cpu").sample_batch(logits, batch).token_ids.tolist()
    assert tokens[0] in (3, 5) and tokens[2] == 6 and tokens[1] == int(free.argmax())
    assert batch_mask(backend, [None, None], torch.device("cpu")) is None

    params = [SamplingParams(temperature=0.0, logit_bias={"7": 100.0}), SamplingParams(temperature=0.0)]
    biased = SamplingBatch.build(params, ["x", "y"], "cpu")
    logits = torch.randn(2, VOCAB)
    tokens = Sampler("cpu").sample_batch(logits.clone(), biased).token_ids.tolist()
    assert tokens == [7, int(logits[1].argmax())]
