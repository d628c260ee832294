"""Messages between the HTTP front end and the scheduler process (ZMQ PUSH/PULL, pickled, small)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from toolkit.runtime.scheduler.scheduler import GenerateInput, TokenOutput


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class FlushCacheRequest:
    pass


@dataclass(frozen=True)
class ShutdownRequest:
    pass


@dataclass(frozen=True)
class SchedulerReady:
    """Sent once the model is loaded: what the front end needs to validate and report."""

    server_args: dict[str, Any]
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    vocab_size: int
    model_class: str
    attention_backend: str


@dataclass(frozen=True)
class BatchOutput:
    outputs: list[TokenOutput]
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FlushCacheResult:
    ok: bool


@dataclass(frozen=True)
class SchedulerFailed:
    message: str


ToScheduler = GenerateInput | AbortRequest | FlushCacheRequest | ShutdownRequest
FromScheduler = SchedulerReady | BatchOutput | FlushCacheResult | SchedulerFailed


@dataclass(frozen=True)
class IpcEndpoints:
    to_scheduler: str
    from_scheduler: str

    @classmethod
    def fresh(cls) -> IpcEndpoints:
        folder = tempfile.mkdtemp(prefix=f"toolkit-{os.getpid()}-")
        return cls(f"ipc://{folder}/to_scheduler", f"ipc://{folder}/from_scheduler")

    def cleanup(self) -> None:
        for endpoint in (self.to_scheduler, self.from_scheduler):
            path = endpoint.removeprefix("ipc://")
            if os.path.exists(path):
                os.unlink(path)
        folder = os.path.dirname(self.to_scheduler.removeprefix("ipc://"))
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
