"""The request → token table: row r lists the KV slots of request r's tokens in order."""
from __future__ import annotations

import torch


class ReqToTokenPool:
    """Rows 0..size-1 are handed out. Row `dummy_row` (= size) is never handed out and stays all zeros, i.e. every
    position maps to slot 0 of the KV pool's reserved padding page: padded decode batches point their dummy
    requests at it."""

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.dummy_row = size
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
        self._free_rows = list(range(size - 1, -1, -1))

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)

    def slots(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        return self.req_to_token[row, start:end].to(torch.int64)
