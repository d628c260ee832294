"""Shared helpers for engine tests: tiny-model engines and a handler that captures the runtime's log."""
from __future__ import annotations

import logging

import torch

from toolkit.runtime.engine import Engine
from toolkit.runtime.model_loader.embedded import embedded_model_path


RETRACTION_LINE = "KV cache pool is full. Retract requests."
# Engine settings whose tiny pool (and small chunks) force retractions on 16 prompts decoding 40 tokens each.
FORCED_RETRACTION = {"max_total_tokens": 480, "schedule_conservativeness": 0.05, "chunked_prefill_size": 64}


def retraction_lines(lines: list[str]) -> list[str]:
    """The scheduler's retraction warnings among captured log lines."""
    return [line for line in lines if line.startswith(RETRACTION_LINE)]


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> LogCapture:
        logging.getLogger("runtime").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("runtime").removeHandler(self)


def tiny_engine(folder, **kwargs) -> Engine:
    """An engine on a tiny checkpoint; the embedded tokenizer decodes its (small) vocabulary."""
    settings = dict(dtype="float32", device="cpu", max_total_tokens=4096, max_running_requests=64,
                    tokenizer_path=str(embedded_model_path()), log_level="warning")
    settings.update(kwargs)
    return Engine(model_path=str(folder), **settings)


def random_prompts(count: int, vocab: int, seed: int, shared_prefix: int = 24) -> list[list[int]]:
    """Prompts of mixed lengths; every third one starts with a common prefix."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, vocab, (shared_prefix,), generator=generator).tolist()
    prompts = []
    for i in range(count):
        length = int(torch.randint(4, 70, (1,), generator=generator))
        body = torch.randint(3, vocab, (length,), generator=generator).tolist()
        prompts.append(prefix + body if i % 3 == 0 else body)
    return prompts
