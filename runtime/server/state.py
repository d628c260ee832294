"""What every HTTP handler can reach: the tokenizer manager, validation context, metrics and health."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runtime.server.ipc import SchedulerReady
from runtime.server.metrics import RequestMetrics
from runtime.server.protocol import ValidationContext
from runtime.server.tokenizer_manager import TokenizerManager
from runtime.server_args import ServerArgs


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

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])
