"""Shedding load: the front end's view of each replica's waiting queue, the 503 a shed request gets, and the log's
summary line (docs/fleets-and-overload.md).

`--max-queued-requests N` has SGLang's meaning: at most N requests wait to be scheduled, per replica. The waiting
queue lives in the scheduler process; the front end estimates it as the requests it has open on the replica that
the scheduler did not report running in its latest step (a request sent but not received yet counts as waiting, as
it will be). The check runs before anything is sent, so a shed request costs the scheduler nothing and gets its
503 before a stream's headers.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Literal

logger = logging.getLogger("runtime")

ShedReason = Literal["queue_full", "waiting_timeout"]
RETRY_AFTER_SECONDS = 1  # the Retry-After of every shed request: the queue moves on within a few decode steps
SHED_LOG_INTERVAL = 10.0  # seconds between two summary lines while requests keep being shed


class Overloaded(Exception):
    """The server sheds this request (its waiting queue is full, or the request waited in it too long); clients
    should retry after `retry_after` seconds. The message is for clients: a sentence naming the limit."""

    def __init__(self, reason: ShedReason, message: str, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after = reason, message, retry_after


def queued(open_requests: int, running: int) -> int:
    """A replica's waiting queue as the front end sees it: open requests the scheduler did not report running."""
    return max(0, open_requests - running)


def over_limit(waiting: int, sequences: int, limit: int | None, replicas: int = 1) -> bool:
    """Would `sequences` more waiting requests make the queue exceed `limit` per replica? Nothing is refused while
    nothing waits: a request of more sequences than the limit (or any, with a limit of 0) runs from an empty queue."""
    if limit is None:
        return False
    capacity = limit * replicas
    return waiting + sequences > max(capacity, sequences)


def queue_full_message(limit: int, waiting: int) -> str:
    return (f"The request queue is full: {waiting} requests are waiting to be scheduled and the server takes at most "
            f"{limit} (--max-queued-requests {limit}); retry after {RETRY_AFTER_SECONDS} s.")


class ShedLog:
    """One log line for the first shed request, then at most one summary line per SHED_LOG_INTERVAL seconds."""

    def __init__(self, interval: float = SHED_LOG_INTERVAL) -> None:
        self.interval = interval
        self.pending: Counter[str] = Counter()
        self.last_line = -float("inf")

    def count(self, reason: ShedReason, now: float | None = None) -> None:
        self.pending[reason] += 1
        self.flush(now)

    def flush(self, now: float | None = None) -> str | None:
        """Write the summary if one is due; returns the line written (or None)."""
        now = time.monotonic() if now is None else now
        if not self.pending or now - self.last_line < self.interval:
            return None
        counts = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.pending.items()))
        since = "" if self.last_line == -float("inf") else f" in the last {now - self.last_line:.0f} s"
        line = f"Shed {sum(self.pending.values())} requests{since} (503, Retry-After {RETRY_AFTER_SECONDS} s): {counts}"
        logger.warning(line)
        self.pending.clear()
        self.last_line = now
        return line
