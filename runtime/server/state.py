"""What every HTTP handler can reach: the tokenizer manager, validation context, metrics and health."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from toolkit.runtime.io_struct import SchedulerReady
from toolkit.runtime.server.metrics import RequestMetrics
from toolkit.runtime.server.protocol import ValidationContext
from toolkit.runtime.server.tokenizer_manager import TokenizerManager
from toolkit.runtime.server_args import ServerArgs


@dataclass
class ServerState:
    args: ServerArgs
    manager: TokenizerManager
    ready: SchedulerReady
    validation: ValidationContext
    tokenizer: Any
    served_model_name: str
    tokenizer_path: str
    metrics: RequestMetrics | None
    started: float = field(default_factory=time.time)
    healthy: bool = True
    draining: bool = False  # set on SIGTERM/SIGINT: every new request gets 503
    replicas_alive: Callable[[], list[bool]] = lambda: [True]  # per DP replica: its scheduler processes run

    def dead_replicas(self) -> list[int]:
        return [d for d, alive in enumerate(self.replicas_alive()) if not alive]

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


STATE = web.AppKey("state", ServerState)  # the one key handlers read the server's state under
