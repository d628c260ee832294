"""Where the front end and the scheduler process meet: two ZMQ PUSH/PULL endpoints (the messages are in
`toolkit.runtime.io_struct`)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

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
