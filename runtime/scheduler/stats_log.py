"""The scheduler's SGLang-format log lines (docs/log-formats.md §2-§4, §6) and the live counters behind them and
/metrics (`io_struct.SchedulerStats`, the type the front end receives)."""
from __future__ import annotations

import logging
import time

from toolkit.runtime.io_struct import SchedulerStats

logger = logging.getLogger("runtime")


class StatsLogger:
    """`writes_batch_lines` False: count, but leave the prefill, decode and retraction lines to another rank (under
    TP only rank 0 writes them, as SGLang does)."""

    def __init__(self, max_total_num_tokens: int, decode_log_interval: int, writes_batch_lines: bool = True) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.decode_log_interval = decode_log_interval
        self.writes_batch_lines = writes_batch_lines
        self.stats = SchedulerStats()
        self._decode_tic = time.perf_counter()
        self._prefill_tic = time.perf_counter()
        self._generated_since_log = 0
        self._last_prefill_tokens = 0

    def token_usage(self, available: int, evictable: int) -> tuple[int, float]:
        """SGLang's `#token`: slots held by requests and locked prefixes (evictable cache excluded)."""
        used = self.max_total_num_tokens - (available + evictable)
        return used, used / self.max_total_num_tokens

    def log_prefill(self, new_seq: int, new_token: int, cached_token: int, used: int, usage: float,
                    running: int, queue: int) -> None:
        now = time.perf_counter()
        stats = self.stats
        stats.input_throughput = self._last_prefill_tokens / max(now - self._prefill_tic, 1e-9)
        self._prefill_tic, self._last_prefill_tokens = now, new_token
        stats.num_running_reqs, stats.num_queue_reqs = running, queue
        stats.num_used_tokens, stats.token_usage = used, round(usage, 2)
        stats.total_prefill_tokens += new_token
        stats.total_cached_tokens += cached_token
        stats.total_prefill_batches += 1
        seen = stats.total_prefill_tokens + stats.total_cached_tokens
        stats.cache_hit_rate = stats.total_cached_tokens / seen if seen else 0.0
        if self.writes_batch_lines:
            logger.info(
                f"Prefill batch. #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
                f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}"
            )

    def on_decode_step(self, generated: int) -> bool:
        """Count a decode step's tokens (those kept: an overlapped step's token for a request that had already
        finished is dropped); True when this step should log a decode line."""
        self._generated_since_log += generated
        self.stats.total_generated_tokens += generated
        self.stats.total_decode_steps += 1
        return self.stats.total_decode_steps % self.decode_log_interval == 0

    def log_decode(self, running: int, used: int, usage: float, cuda_graph: bool, queue: int,
                   grammar_queue: int = 0) -> None:
        now = time.perf_counter()
        stats = self.stats
        stats.gen_throughput = self._generated_since_log / max(now - self._decode_tic, 1e-9)
        self._decode_tic, self._generated_since_log = now, 0
        stats.num_running_reqs, stats.num_queue_reqs = running, queue
        stats.num_used_tokens, stats.token_usage = used, round(usage, 2)
        if self.writes_batch_lines:
            logger.info(
                f"Decode batch. #running-req: {running}, #token: {used}, token usage: {usage:.2f}, "
                f"cuda graph: {cuda_graph}, gen throughput (token/s): {stats.gen_throughput:.2f}, #queue-req: {queue}, "
                f"#grammar-queue-req: {grammar_queue}"
            )

    def log_retraction(self, retracted: int, old_ratio: float, new_ratio: float) -> None:
        self.stats.num_retracted_reqs = retracted
        self.stats.total_retracted_reqs += retracted
        if self.writes_batch_lines:
            logger.info(
                f"KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, "
                f"#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}"
            )

    def log_memory_leak(self, available: int, evictable: int, protected: int) -> None:
        self.stats.memory_leak_detected = True
        logger.error(
            "token_to_kv_pool_allocator memory leak detected! "
            f"max_total_num_tokens={self.max_total_num_tokens}, available_size={available}, "
            f"evictable_size={evictable}, protected_size={protected}"
        )
