"""Sends one prepared request body and fills in its `RequestOutcome`: timings, tokens, or the kind of failure."""
from __future__ import annotations

import asyncio
from time import perf_counter

from toolkit.bench.accounting import token_counts
from toolkit.bench.backends import ENDPOINTS, Backend, StreamTokens, read_tokens
from toolkit.bench.http import HttpClient, ProtocolError
from toolkit.bench.outcome import CANCELLED, SHED, RequestOutcome
from toolkit.bench.sse import StreamError, split_events


Unsettled = list[tuple[RequestOutcome, StreamTokens]]  # responses whose token counts the server did not give


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def settle(unsettled: Unsettled, tokenizer) -> None:
    """Counts tokens with the tokenizer where the server did not; kept off the load loop, as it is slow."""
    for out, tokens in unsettled:
        out.token_counts, out.output_len = token_counts(tokens, tokenizer)


class Client:
    """Streams requests to `base_url`; `send` never raises for a failed request, it records the failure."""

    def __init__(self, base_url: str, backend: Backend, *, api_key: str | None = None,
                 request_timeout: float | None = None, tokenizer=None, keep_text: bool = False):
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(api_key)}
        self.http = HttpClient(base_url, headers)
        self.path = ENDPOINTS[backend]
        self.backend = backend
        self.timeout = request_timeout
        self.tokenizer = tokenizer
        self.keep_text = keep_text
        self._unsettled: Unsettled = []

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        self.http.close()

    async def send(self, body: bytes, out: RequestOutcome) -> None:
        out.sent = perf_counter()
        try:
            response = await self.http.post(self.path, body, self.timeout)
            if response.status != 200:
                message = response.body.decode("utf-8", "replace").strip()
                kind = SHED if response.status == 503 else f"http_{response.status}"
                out.fail(kind, message, response.times[-1] if response.times else perf_counter())
                return
            self._account(out, response.times, response.chunks)
        except asyncio.CancelledError:
            out.fail(CANCELLED, "stopped before the response ended", perf_counter())
        except TimeoutError:
            out.fail("timeout", "no complete response within --request-timeout", perf_counter())
        except OSError as exc:
            out.fail("connection", f"{type(exc).__name__}: {exc}", perf_counter())
        except ProtocolError as exc:
            out.fail("malformed_response", str(exc), perf_counter())
        except StreamError as exc:
            out.fail(exc.kind, str(exc), perf_counter())

    def settle(self) -> None:
        settle(self.take_unsettled(), self.tokenizer)

    def take_unsettled(self) -> Unsettled:
        """The responses still to count, handed over (a worker process leaves them to the tokenizer's owner)."""
        unsettled, self._unsettled = self._unsettled, []
        return unsettled

    def _account(self, out: RequestOutcome, times: list[float], chunks: list[bytes]) -> None:
        events = split_events(times, chunks)
        tokens = read_tokens(self.backend, events)
        if not tokens.times:
            raise StreamError("empty_response", "the stream carried no tokens")
        out.token_times = tokens.times
        if None in tokens.counts:
            self._unsettled.append((out, tokens))
        else:
            out.token_counts, out.output_len = token_counts(tokens, None)
        if tokens.prompt_tokens:
            out.input_len = tokens.prompt_tokens
        out.cached_tokens = tokens.cached_tokens
        if self.keep_text:
            out.text = "".join(tokens.texts)
        out.ended = times[-1]
