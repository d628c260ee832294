"""A lean HTTP/1.1 client for the load loop: keep-alive connections that timestamp every body read on arrival.

aiohttp resumes a task for each network read of a streamed body (~20 µs), which caps a one-core client at a few
hundred 64-token streams per second. Here the protocol callback stamps and stores each read and the request's
coroutine wakes once, when the response is complete. Probing and `/metrics` sampling still use aiohttp.
"""
from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from itertools import accumulate
from time import perf_counter
from urllib.parse import urlsplit

_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _DONE = range(5)
_LAST_CHUNK = b"0\r\n\r\n"
_MAX_HEAD = 64 * 1024


class ProtocolError(Exception):
    """The server's reply is not valid HTTP/1.1."""


@dataclass(slots=True)
class Response:
    """Status, headers (lower-case names) and the body as it arrived: `chunks[i]` came at `times[i]`."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    keep_alive: bool = True

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; reads are kept raw until the response is complete."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done: asyncio.Future | None = None
        self.response = Response()
        self.mode = _DONE
        self.head = b""
        self.remaining = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.mode == _UNTIL_CLOSE:
            self._finish()
        elif self.mode != _DONE:
            self.fail(ConnectionResetError("the server closed the connection before the response ended"))

    def request(self, data: bytes) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.response, self.mode, self.head, self.remaining = Response(), _HEAD, b"", 0
        if self.closed or self.transport.is_closing():
            self.fail(ConnectionResetError("the connection was closed"))
        else:
            self.transport.write(data)
        return self.done

    def fail(self, exc: BaseException) -> None:
        self.mode = _DONE
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        t = perf_counter()
        if self.mode == _DONE:
            return
        try:
            if self.mode == _HEAD:
                data = self._read_head(data)
                if data is None:
                    return
            if data or self.mode == _LENGTH:
                self._read_body(t, data)
        except (ProtocolError, ValueError) as exc:
            self.fail(ProtocolError(f"bad HTTP response: {exc}"))

    def _read_head(self, data: bytes) -> bytes | None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > _MAX_HEAD:
                raise ProtocolError("response headers too long")
            return None
        lines = self.head[:end].decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ", 2)[:2]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        self.response.status, self.response.headers = int(status), headers
        self.response.keep_alive = connection != "close" and (version != "HTTP/1.0" or connection == "keep-alive")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode = _CHUNKED
        elif "content-length" in headers:
            self.mode, self.remaining = _LENGTH, int(headers["content-length"])
        else:
            self.mode, self.response.keep_alive = _UNTIL_CLOSE, False
        return self.head[end + 4 :]

    def _read_body(self, t: float, data: bytes) -> None:
        if self.mode == _LENGTH:
            data = data[: self.remaining]
            self.remaining -= len(data)
        if data:
            self.response.times.append(t)
            self.response.chunks.append(data)
        if self.mode == _LENGTH and self.remaining == 0:
            self._finish()
        elif self.mode == _CHUNKED and (data.endswith(_LAST_CHUNK) or len(data) < len(_LAST_CHUNK)):
            self._finish_if_complete()

    def _finish_if_complete(self) -> None:
        # NOTE: reads are kept raw and de-framed once, when the tail looks like the last chunk: the hot path is
        # one timestamp, two appends and one `endswith` per read.
        payload = dechunk(self.response.times, self.response.chunks)
        if payload is not None:
            self.response.times, self.response.chunks = payload
            self._finish()

    def _finish(self) -> None:
        self.mode = _DONE
        if not self.response.keep_alive:
            self.close()
        if self.done is not None and not self.done.done():
            self.done.set_result(self.response)


def dechunk(times: list[float], reads: list[bytes]) -> tuple[list[float], list[bytes]] | None:
    """The payload of each HTTP chunk with the arrival time of the read that completed it; None if incomplete."""
    raw = b"".join(reads)
    read_ends = list(accumulate(map(len, reads)))
    out_times, payloads, pos, r = [], [], 0, 0
    while True:
        end = raw.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(raw[pos:end].split(b";", 1)[0], 16)
        pos = end + 2
        if size == 0:
            return (out_times, payloads) if raw.startswith(b"\r\n", pos) or b"\r\n\r\n" in raw[pos:] else None
        stop = pos + size
        if stop + 2 > len(raw):
            return None
        while read_ends[r] < stop:
            r += 1
        out_times.append(times[r])
        payloads.append(raw[pos:stop])
        pos = stop + 2


class HttpClient:
    """POSTs to one origin over a pool of keep-alive connections (one per request in flight)."""

    def __init__(self, base_url: str, headers: dict[str, str]):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        host_header = parts.netloc.rpartition("@")[2]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {host_header}\r\n{extra}".encode("latin-1")
        self._idle: list[_Connection] = []

    async def _connect(self, timeout: float | None) -> _Connection:
        connecting = asyncio.get_running_loop().create_connection(_Connection, self.host, self.port, ssl=self.ssl)
        _, conn = await asyncio.wait_for(connecting, timeout)
        return conn

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def post(self, path: str, body: bytes, timeout: float | None = None) -> Response:
        """The complete response; raises `TimeoutError`, `OSError` (connection) or `ProtocolError`."""
        request = (b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % ((self.prefix + path).encode(),
                   self._head, len(body))) + body
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, request, timeout)
            except ConnectionResetError:
                if conn.response.status:
                    raise
                # NOTE: the server may drop an idle keep-alive connection as we reuse it: retry once, fresh.
        return await self._exchange(await self._connect(timeout), request, timeout)

    async def _exchange(self, conn: _Connection, request: bytes, timeout: float | None) -> Response:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout, conn.fail, TimeoutError()) if timeout else None
        try:
            response = await conn.request(request)
        except BaseException:
            conn.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not conn.closed:
            self._idle.append(conn)
        return response

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
