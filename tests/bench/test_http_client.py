"""The lean HTTP/1.1 client against raw servers: every body framing, keep-alive reuse, stale sockets, timeouts."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from toolkit.bench import eventloop
from toolkit.bench.http import HttpClient, ProtocolError


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length")), 0)
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def raw_server(replies: list[list[bytes | float]], close_after: bool = False):
    """Answers the n-th request with `replies[n]`: bytes are written, floats are pauses (seconds); an empty
    reply closes the connection without an answer."""
    seen: list[bytes] = []

    async def handle(reader, writer):
        try:
            while len(seen) < len(replies):
                seen.append(await _read_request(reader))
                if not replies[len(seen) - 1]:
                    break
                for part in replies[len(seen) - 1]:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", seen


def _run(coro):
    return eventloop.run(asyncio.wait_for(coro, 10))


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_body_split_anywhere_keeps_per_read_times_and_the_connection():
    replies = [[CHUNKED_HEAD + b"5\r\nhel", 0.01, b"lo\r\n6\r\n wo", 0.3, b"rld\r\n", 0.01, b"0\r\n", 0.01, b"\r\n"],
               [CHUNKED_HEAD + b"2\r\nok\r\n0\r\n\r\n"]]

    async def go():
        async with raw_server(replies) as (url, seen):
            client = HttpClient(url + "/base", {"X-Key": "v"})
            first = await client.post("/generate", b'{"a": 1}')
            second = await client.post("/generate", b"{}")
            client.close()
            return first, second, seen

    first, second, seen = _run(go())
    assert first.status == 200 and first.body == b"hello world" and first.chunks == [b"hello", b" world"]
    # " world" cannot be read before its end is written, 0.3 s after "hello" was complete; 0.2 s of margin for a
    # late read of "hello" on a busy machine (one stamp at the response's end would give 0)
    assert first.times[1] - first.times[0] >= 0.1
    assert second.body == b"ok"
    assert len(seen) == 2, "the second request reused the keep-alive connection"
    assert seen[0].startswith(b"POST /base/generate HTTP/1.1\r\n") and b"X-Key: v\r\n" in seen[0]
    assert seen[0].endswith(b'Content-Length: 8\r\n\r\n{"a": 1}')


def test_content_length_and_close_delimited_bodies():
    replies = [[b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nbo", 0.01, b"om"],
               [b"HTTP/1.0 200 OK\r\n\r\ndata: x\n\n", 0.01, b"data: y\n\n"]]

    async def go():
        async with raw_server(replies) as (url, _):
            client = HttpClient(url, {})
            return await client.post("/a", b""), await client.post("/a", b"")

    error, streamed = _run(go())
    assert (error.status, error.body) == (500, b"boom")
    assert streamed.body == b"data: x\n\ndata: y\n\n" and not streamed.keep_alive


def test_a_keep_alive_connection_dropped_by_the_server_is_retried_once_on_a_fresh_one():
    ok = [CHUNKED_HEAD + b"1\r\na\r\n0\r\n\r\n"]

    async def go():
        async with raw_server([ok, [], ok]) as (url, seen):
            client = HttpClient(url, {})
            return await client.post("/a", b""), await client.post("/a", b""), seen

    first, second, seen = _run(go())
    assert first.body == b"a" and second.body == b"a" and len(seen) == 3


def test_timeouts_refusals_and_garbage():
    async def go():
        async with raw_server([[b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\npart", 5.0]]) as (url, _):
            with pytest.raises(TimeoutError):
                await HttpClient(url, {}).post("/a", b"", timeout=0.2)
        async with raw_server([[b"NOT HTTP AT ALL\r\n\r\n"]]) as (url, _):
            with pytest.raises(ProtocolError):
                await HttpClient(url, {}).post("/a", b"", timeout=2)
        async with raw_server([[CHUNKED_HEAD + b"zz\r\n"]]) as (url, _):
            with pytest.raises(ProtocolError):
                await HttpClient(url, {}).post("/a", b"", timeout=2)
        async with raw_server([[CHUNKED_HEAD + b"5\r\nab"]], close_after=True) as (url, _):
            with pytest.raises(ConnectionResetError):
                await HttpClient(url, {}).post("/a", b"", timeout=2)
        with pytest.raises(OSError):
            await HttpClient(url, {}).post("/a", b"", timeout=2)

    _run(go())


def test_only_http_urls_are_accepted():
    with pytest.raises(ValueError):
        HttpClient("ftp://example.com", {})
