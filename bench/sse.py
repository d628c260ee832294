"""Server-sent events: split a streamed body into JSON payloads, each stamped with the time its last byte came."""
from __future__ import annotations

import json

DONE = object()


class StreamError(Exception):
    """A response that is not a well-formed stream; `kind` is how the failure is counted."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _payload(event: bytes):
    if event.startswith(b"data: ") and b"\n" not in event:
        data = event[6:]
    else:
        lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return None  # comments, `event:` and `id:` lines carry no payload
        data = b"\n".join(lines)
    if data == b"[DONE]":
        return DONE
    try:
        return json.loads(data)
    except ValueError:
        raise StreamError("malformed_response", f"event is not JSON: {data[:80]!r}") from None


def split_events(times: list[float], chunks: list[bytes]) -> tuple[list[tuple[float, object]], bool]:
    """(time, payload) for each data event in arrival order, and whether `data: [DONE]` ended the stream."""
    events: list[tuple[float, object]] = []
    pending = b""
    for t, chunk in zip(times, chunks):
        pending += chunk
        if b"\r" in pending:
            pending = pending.replace(b"\r\n", b"\n")
        *complete, pending = pending.split(b"\n\n")
        for event in complete:
            payload = _payload(event.strip(b"\n"))
            if payload is DONE:
                return events, True
            if payload is not None:
                events.append((t, payload))
    if pending.strip():
        payload = _payload(pending.strip(b"\n"))
        if payload is DONE:
            return events, True
        if payload is not None:
            events.append((times[-1], payload))
    return events, False
