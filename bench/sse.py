"""Server-sent events: split a streamed body into JSON payloads, each stamped with the time its last byte came."""
from __future__ import annotations

from itertools import accumulate

try:
    from orjson import loads
except ImportError:  # orjson is 4x faster on the per-token path; json is the portable fallback
    from json import loads

DONE = object()


class StreamError(Exception):
    """A response that is not a well-formed stream; `kind` is how the failure is counted."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _payload(event: bytes):
    if event[:6] == b"data: " and b"\n" not in event:
        data = event[6:]
    else:
        lines = [line[5:].lstrip(b" ") for line in event.strip(b"\n").split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return None  # comments, `event:` and `id:` lines carry no payload
        data = b"\n".join(lines)
    if data == b"[DONE]":
        return DONE
    try:
        return loads(data)
    except ValueError:
        raise StreamError("malformed_response", f"event is not JSON: {data[:80]!r}") from None


def _without_crlf(chunks: list[bytes]) -> list[bytes]:
    """CRLF line ends made LF, read by read, so each read keeps its own bytes (and its arrival time)."""
    out = []
    for i, chunk in enumerate(chunks):
        chunk = chunk.replace(b"\r\n", b"\n")
        if chunk.endswith(b"\r") and i + 1 < len(chunks) and chunks[i + 1].startswith(b"\n"):
            chunk = chunk[:-1]
        out.append(chunk)
    return out


def split_events(times: list[float], chunks: list[bytes]) -> list[tuple[float, object]]:
    """(time, payload) for each data event in arrival order, up to `data: [DONE]` if the stream sent one."""
    body = b"".join(chunks)
    if b"\r" in body:
        chunks = _without_crlf(chunks)
        body = b"".join(chunks)
    ends = list(accumulate(map(len, chunks)))
    events: list[tuple[float, object]] = []
    *complete, rest = body.split(b"\n\n")
    position, read = 0, 0
    for event in complete:
        position += len(event) + 2
        while ends[read] < position:
            read += 1
        payload = _payload(event)
        if payload is DONE:
            return events
        if payload is not None:
            events.append((times[read], payload))
    if rest.strip():
        payload = _payload(rest)
        if payload is DONE:
            return events
        if payload is not None:
            events.append((times[-1], payload))
    return events
