"""Free-slot allocator over the KV pool, in pages of `page_size` tokens (SGLang's paged allocator).

A request's token at position p lives in slot `page * page_size + p % page_size` of one of its pages, so a new
token continues the request's last page until it is full. Frees return whole pages.
"""
from __future__ import annotations

import torch


class TokenAllocator:
    def __init__(self, size: int, page_size: int, device: torch.device | str) -> None:
        if size % page_size:
            raise ValueError(f"KV pool size {size} is not a multiple of page_size {page_size}")
        self.size = size
        self.page_size = page_size
        self.device = device
        self.num_pages = size // page_size
        self.clear()

    def clear(self) -> None:
        # NOTE: page 0 is the padding page, so usable pages are 1..num_pages.
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self._released: list[torch.Tensor] = []

    def available_size(self) -> int:
        released = sum(int(p.numel()) for p in self._released)
        return (int(self._free_pages.numel()) + released) * self.page_size

    def _take_pages(self, count: int) -> torch.Tensor | None:
        if count > self._free_pages.numel() and self._released:
            # NOTE: sorted, as SGLang merges its free pages: pages come back in the order requests finished (a
            # decode batch's slots interleave its requests), and a prompt given ascending free pages has its KV in
            # long runs (the CPU decode kernel reads contiguous slots ~30% faster than scattered ones).
            self._free_pages = torch.sort(torch.cat([self._free_pages, *self._released])).values
            self._released = []
        if count > self._free_pages.numel():
            return None
        pages, self._free_pages = self._free_pages[:count], self._free_pages[count:]
        return pages

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for `num_tokens` tokens that start a fresh sequence (page-aligned start)."""
        pages = self._take_pages(-(-num_tokens // self.page_size))
        if pages is None:
            return None
        slots = (pages[:, None] * self.page_size + torch.arange(self.page_size, device=self.device)).reshape(-1)
        return slots[:num_tokens]

    def alloc_extend(self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]) -> torch.Tensor | None:
        """Slots for tokens prefix_lens[i]..seq_lens[i]-1 of each request; last_locs[i] is the slot of token
        prefix_lens[i]-1 (ignored when the prefix is page-aligned)."""
        ps = self.page_size
        new_pages = [-(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens)]
        pages = self._take_pages(sum(new_pages))
        if pages is None:
            return None
        pieces, cursor = [], 0
        for prefix, seq, last, count in zip(prefix_lens, seq_lens, last_locs, new_pages):
            in_last_page = min(seq, -(-prefix // ps) * ps) - prefix
            if in_last_page > 0:
                pieces.append(torch.arange(last + 1, last + 1 + in_last_page, device=self.device))
            own = pages[cursor : cursor + count]
            cursor += count
            fresh = (own[:, None] * ps + torch.arange(ps, device=self.device)).reshape(-1)
            pieces.append(fresh[: seq - prefix - max(in_last_page, 0)])
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=self.device)

    def alloc_decode(self, seq_lens: torch.Tensor, last_locs: torch.Tensor) -> torch.Tensor | None:
        """One slot per request for its token at position seq_lens[i]-1."""
        if self.page_size == 1:
            return self.alloc(int(seq_lens.numel()))
        starts_page = (seq_lens - 1) % self.page_size == 0
        pages = self._take_pages(int(starts_page.sum()))
        if pages is None:
            return None
        out = last_locs + 1
        out[starts_page] = pages * self.page_size
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        if self.page_size == 1:
            self._released.append(slots.to(torch.int64).clone())
        else:
            self._released.append(torch.unique(slots.to(torch.int64) // self.page_size))
