"""Admission, the whole rule in one class: which waiting requests join the next prefill batch (SGLang's
`PrefillAdder`, docs/scheduling.md §1).

Budget = free + evictable KV tokens − Σ over running requests of min(max_new − generated, 4096) × new_token_ratio.
A request costs page_ceil(extend) + min(max_new, 4096) of it. `max_prefill_tokens` bounds the batch's input
tokens (the first request may exceed it), `chunked_prefill_size` splits a long input into chunks, and
`max_running_requests` bounds how many requests may run at once. A request that could not fit even in an empty
pool is refused for good (`never_fits`).
"""
from __future__ import annotations

from contextlib import contextmanager
from enum import Enum, auto
from typing import Iterator, Protocol

from toolkit.runtime.scheduler.request import Req

CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096


class AddReqResult(Enum):
    CONTINUE = auto()  # admitted; more may follow
    NO_TOKEN = auto()  # the KV budget is exhausted
    OTHER = auto()  # the input-token or chunk budget is exhausted
    NO_REQUEST_SLOT = auto()  # max_running_requests are running or admitted


class AdmissionCache(Protocol):
    """What admission reads and locks of the KV cache (the `CacheManager`)."""

    page_size: int

    def available_size(self) -> int: ...

    def evictable_size(self) -> int: ...

    def lock_prefix(self, req: Req) -> None: ...

    def unlock_prefix(self, req: Req) -> None: ...


def clipped_max_new(req: Req) -> int:
    return min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS_ESTIMATION)


def running_reservation(running: list[Req], new_token_ratio: float) -> float:
    """KV tokens the running requests are expected to still need."""
    return sum(
        min(r.sampling_params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS_ESTIMATION) * new_token_ratio
        for r in running
    )


class PrefillAdder:
    def __init__(
        self,
        cache: AdmissionCache,
        running: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        mixed_with_decode_tokens: int = 0,
        max_running_requests: int | None = None,
    ) -> None:
        self.cache = cache
        self.running_count = len(running)
        self.rem_requests = None if max_running_requests is None else max_running_requests - len(running)
        self.page_size = cache.page_size
        self.rem_input_tokens = max_prefill_tokens - mixed_with_decode_tokens
        self.rem_chunk_tokens = None if chunked_prefill_size is None else chunked_prefill_size - mixed_with_decode_tokens
        self.rem_total_token_offset = mixed_with_decode_tokens + running_reservation(running, new_token_ratio)
        self.cur_rem_token_offset = mixed_with_decode_tokens
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0

    @property
    def rem_total_tokens(self) -> float:
        return self._free_and_evictable() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._free_and_evictable() - self.cur_rem_token_offset

    def _free_and_evictable(self) -> int:
        return self.cache.available_size() + self.cache.evictable_size()

    def ceil_paged(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    @property
    def has_request_slot(self) -> bool:
        return self.rem_requests is None or len(self.can_run_list) < self.rem_requests

    def budget_state(self) -> AddReqResult:
        if not self.has_request_slot:
            return AddReqResult.NO_REQUEST_SLOT
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        extend_len = self.ceil_paged(extend_len)
        self.rem_total_token_offset += extend_len + max_new_tokens
        self.cur_rem_token_offset += extend_len
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    def add_chunked_req(self, req: Req) -> Req | None:
        """The next chunk of the request being prefilled in chunks; returns it again if more chunks follow."""
        truncated = req.extend_input_len > self.rem_chunk_tokens
        req.extend_input_len = min(req.extend_input_len, self.rem_chunk_tokens)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_budget(0, req.extend_input_len, 0 if truncated else clipped_max_new(req))
        return req if truncated else None

    @contextmanager
    def _locked(self, req: Req) -> Iterator[None]:
        self.cache.lock_prefix(req)
        try:
            yield
        finally:
            self.cache.unlock_prefix(req)

    def add_one_req(self, req: Req) -> AddReqResult:
        if not self.has_request_slot:
            return AddReqResult.NO_REQUEST_SLOT
        total_tokens = req.extend_input_len + clipped_max_new(req)
        input_tokens = self.ceil_paged(req.extend_input_len)
        prefix_len = len(req.prefix_indices)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        with self._locked(req):
            # NOTE: locking the prefix makes it non-evictable, so the budget may have shrunk.
            if total_tokens >= self.rem_total_tokens:
                return AddReqResult.NO_TOKEN
            if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
                self.can_run_list.append(req)
                self.cache.lock_prefix(req)
                self._update_budget(prefix_len, input_tokens, clipped_max_new(req))
            else:
                truncated_len = self.rem_chunk_tokens - self.page_size + 1
                if truncated_len <= 0:
                    return AddReqResult.OTHER
                req.extend_input_len = truncated_len
                req.fill_ids = req.fill_ids[: prefix_len + truncated_len]
                self.can_run_list.append(req)
                self.new_chunked_req = req
                self.cache.lock_prefix(req)
                self._update_budget(prefix_len, truncated_len, 0)
        return self.budget_state()


def never_fits(req: Req, pool_size: int) -> str | None:
    """Why `req` cannot run even alone in an empty pool (None when it can). Only meaningful when nothing runs and
    no prefix is locked: the whole pool is then free or evictable."""
    needed = req.extend_input_len + clipped_max_new(req)
    if needed < pool_size:
        return None
    return (f"the request needs {needed} KV tokens (input {req.extend_input_len} + max_new_tokens "
            f"{clipped_max_new(req)}) but the KV pool holds {pool_size}; raise --max-total-tokens or "
            "--mem-fraction-static, or lower max_new_tokens")
