"""One HTTP session to the target: sends a prepared body, streams the reply, and fills in a `RequestOutcome`."""
from __future__ import annotations

import asyncio
from time import perf_counter

import aiohttp

from bench.accounting import token_counts
from bench.backends import ENDPOINTS, Backend, read_tokens
from bench.outcome import CANCELLED, RequestOutcome
from bench.sse import StreamError, split_events


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Streams requests to `base_url` with one pooled `aiohttp` session; never raises for a failed request."""

    def __init__(self, base_url: str, backend: Backend, *, api_key: str | None = None,
                 request_timeout: float | None = None, tokenizer=None, keep_text: bool = False):
        self.url = base_url.rstrip("/") + ENDPOINTS[backend]
        self.backend = backend
        self.headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.tokenizer = tokenizer
        self.keep_text = keep_text
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, auto_decompress=False)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def send(self, body: bytes, out: RequestOutcome) -> None:
        out.sent = perf_counter()
        try:
            async with self.session.post(self.url, data=body, headers=self.headers) as resp:
                if resp.status != 200:
                    out.fail(f"http_{resp.status}", (await resp.text(errors="replace")).strip(), perf_counter())
                    return
                times, chunks = [], []
                async for chunk in resp.content.iter_any():
                    times.append(perf_counter())
                    chunks.append(chunk)
            self._account(out, times, chunks)
        except asyncio.CancelledError:
            out.fail(CANCELLED, "stopped before the response ended", perf_counter())
        except TimeoutError:
            out.fail("timeout", "no complete response within --request-timeout", perf_counter())
        except (aiohttp.ClientError, OSError) as exc:
            out.fail("connection", f"{type(exc).__name__}: {exc}", perf_counter())
        except StreamError as exc:
            out.fail(exc.kind, str(exc), perf_counter())

    def _account(self, out: RequestOutcome, times: list[float], chunks: list[bytes]) -> None:
        events, _ = split_events(times, chunks)
        tokens = read_tokens(self.backend, events)
        if not tokens.times:
            raise StreamError("empty_response", "the stream carried no tokens")
        out.token_times = tokens.times
        out.token_counts, out.output_len = token_counts(tokens, self.tokenizer)
        if tokens.prompt_tokens:
            out.input_len = tokens.prompt_tokens
        if self.keep_text:
            out.text = "".join(tokens.texts)
        out.ended = times[-1]
