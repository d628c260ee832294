"""What the client observed for one request, on the `time.perf_counter` clock."""
from __future__ import annotations

from dataclasses import dataclass, field

CANCELLED = "cancelled"
SHED = "shed"  # the server refused the request for load: HTTP 503, or an in-stream error with code 503


@dataclass(slots=True)
class RequestOutcome:
    """One request. `scheduled` is its offset from the run start; the other times are absolute perf_counter values.

    `token_times[i]` is when the event carrying `token_counts[i]` tokens arrived; `ended` is when the stream closed.
    """

    index: int
    scheduled: float
    input_len: int
    dispatched: float = 0.0
    sent: float = 0.0
    ended: float = 0.0
    token_times: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    output_len: int = 0
    cached_tokens: int | None = None
    error: str | None = None
    message: str = ""
    text: str = ""
    session: int | None = None  # multi-turn runs: the conversation and its 0-based turn
    turn: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ended > 0

    def fail(self, kind: str, message: str, at: float) -> None:
        self.error, self.message, self.ended = kind, message[:300], at
