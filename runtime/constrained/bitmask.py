"""One token bitmask per step for the whole batch: a row for every request, filled by the constrained requests'
matchers; the sampler applies it to those rows only, so free requests in the same batch are untouched."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.runtime.constrained.backend import GrammarBackend, RequestGrammar


@dataclass
class VocabMask:
    """A step's bitmask (on the logits' device) and the batch rows it constrains."""

    bitmask: torch.Tensor
    rows: list[int]
    backend: GrammarBackend

    def apply(self, logits: torch.Tensor) -> None:
        self.backend.apply_bitmask(logits, self.bitmask, self.rows)


def batch_mask(backend: GrammarBackend | None, grammars: list[RequestGrammar | None],
               device: torch.device) -> VocabMask | None:
    """The step's mask, or None when no request in the batch is constrained."""
    rows = [row for row, grammar in enumerate(grammars) if grammar is not None]
    if not rows or backend is None:
        return None
    # NOTE: a fresh host buffer per step: the step it serves may still be queued on the forward thread (overlap)
    # when the next one is built; a row costs vocab/8 bytes, and only constrained rows are filled.
    bitmask = backend.allocate_bitmask(len(grammars))
    for row in rows:
        grammars[row].fill(bitmask, row)
    if device.type != "cpu":
        bitmask = bitmask.to(device, non_blocking=True)
    return VocabMask(bitmask, rows, backend)
