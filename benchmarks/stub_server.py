"""A lean streaming stub for measuring the client itself: `python -m benchmarks.stub_server --port 8123`.

It answers `/generate`, `/v1/completions` and `/v1/chat/completions` with the same canned response (`--tokens`
SSE events, one token each, SGLang or OpenAI shape by path): the first `--ttft-ms` after the request arrives,
then one event per decode step of `--itl-ms` for every stream at once, as a batching server does. Raw asyncio
protocol, no framework, so that one core serves thousands of streams.
"""
from __future__ import annotations

import argparse
import asyncio
import json

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_MODELS = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
_END = b"0\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict | str) -> bytes:
    return _chunk(b"data: " + (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()) + b"\n\n")


def canned_events(path: bytes, tokens: int) -> list[bytes]:
    """The response body for `path` as HTTP chunks: one per token event, then usage, [DONE] and the end."""
    events, text = [], ""
    for n in range(1, tokens + 1):
        text += " the"
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        if path == b"/generate":
            obj = {"text": text, "meta_info": {"prompt_tokens": 8, "completion_tokens": n}, "index": 0}
        elif path == b"/v1/chat/completions":
            obj = {"choices": [{"index": 0, "delta": {"content": " the"}, "finish_reason": None}], "usage": usage}
        else:
            obj = {"choices": [{"index": 0, "text": " the", "finish_reason": None}], "usage": usage}
        events.append(_event(obj))
    events[-1] += _event({"choices": [], "usage": usage}) + _event("[DONE]") + _END
    return events


class StreamStub:
    def __init__(self, tokens: int, ttft: float, itl: float):
        self.tokens, self.ttft, self.itl = tokens, ttft, itl
        self.bodies = {p: canned_events(p, tokens) for p in (b"/generate", b"/v1/completions",
                                                             b"/v1/chat/completions")}
        self.active: list[list] = []  # [transport, events, next index]

    def start(self, transport: asyncio.Transport, path: bytes) -> None:
        events = self.bodies.get(path)
        if events is None:
            body = _MODELS if path.startswith(b"/v1/models") else b"{}"
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(body), body))
            return
        asyncio.get_running_loop().call_later(self.ttft, self._first, transport, events)

    def _first(self, transport: asyncio.Transport, events: list[bytes]) -> None:
        if not transport.is_closing():
            transport.write(_HEAD + events[0])
            if len(events) > 1:
                self.active.append([transport, events, 1])

    async def decode_loop(self) -> None:
        loop = asyncio.get_running_loop()
        step = loop.time()
        while True:
            step += self.itl
            await asyncio.sleep(max(0.0, step - loop.time()))
            still = []
            for stream in self.active:
                transport, events, n = stream
                if transport.is_closing():
                    continue
                transport.write(events[n])
                stream[2] = n + 1
                if n + 1 < len(events):
                    still.append(stream)
            self.active = still


def _content_length(head: bytes) -> int:
    at = head.find(b"content-length:")
    if at < 0:
        return 0
    end = head.find(b"\r\n", at)
    return int(head[at + 15 : end if end >= 0 else len(head)])


class _Connection(asyncio.Protocol):
    def __init__(self, stub: StreamStub):
        self.stub, self.buffer, self.transport = stub, b"", None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = _content_length(self.buffer[:end].lower())
            if len(self.buffer) < end + 4 + length:
                return
            path = self.buffer[: self.buffer.find(b"\r\n")].split(b" ")[1]
            self.buffer = self.buffer[end + 4 + length:]
            self.stub.start(self.transport, path)


async def serve(port: int, tokens: int, ttft: float, itl: float) -> None:
    stub = StreamStub(tokens, ttft, itl)
    server = await asyncio.get_running_loop().create_server(lambda: _Connection(stub), "127.0.0.1", port,
                                                           backlog=4096)
    async with server:
        await stub.decode_loop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port, args.tokens, args.ttft_ms / 1000, args.itl_ms / 1000))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
