"""The KV slot allocator: pages handed out from the front of the free list, returned pages merged back in
ascending order once the list runs dry, a request's decode tokens continuing its last page."""
from __future__ import annotations

import torch

from toolkit.runtime.memory.allocator import TokenAllocator


def test_returned_slots_are_handed_out_again_in_ascending_runs():
    allocator = TokenAllocator(64, 1, "cpu")
    first = allocator.alloc(60)
    # a decode batch's slots come back interleaved, in the order its requests finished
    allocator.free(first[1::2])
    allocator.free(first[0::2])
    assert allocator.available_size() == 64
    prompt = allocator.alloc(40)
    assert prompt is not None
    assert prompt.tolist() == list(range(1, 41))  # the unused tail and the returned pages merged, sorted
    assert allocator.available_size() == 24


def test_decode_continues_the_last_page_and_opens_one_when_it_is_full():
    allocator = TokenAllocator(64, 16, "cpu")
    prompt = allocator.alloc(16)
    assert prompt.tolist() == list(range(16, 32))
    seq_lens, last = torch.tensor([17]), prompt[-1:]
    opened = allocator.alloc_decode(seq_lens, last.clone())
    assert opened.tolist() == [32]  # token 16 starts page 2
    continued = allocator.alloc_decode(seq_lens + 1, opened.clone())
    assert continued.tolist() == [33]


def test_an_allocation_larger_than_the_free_pages_fails_without_taking_any():
    allocator = TokenAllocator(32, 16, "cpu")
    assert allocator.alloc(33) is None
    assert allocator.available_size() == 32
    assert allocator.alloc(32) is not None and allocator.available_size() == 0
