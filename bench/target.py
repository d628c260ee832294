"""The server under test: reachability and the served model's name, checked once before any load is sent."""
from __future__ import annotations

import aiohttp

from toolkit.bench.client import auth_headers

_PROBE_TIMEOUT_S = 10.0


class TargetError(RuntimeError):
    """The server cannot be used; the message says why in one line."""


async def _served_models(session: aiohttp.ClientSession, base_url: str, api_key: str | None) -> list[str] | str:
    """The ids from `GET /v1/models`, or a reason why they are unknown."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, headers=auth_headers(api_key)) as resp:
            if resp.status == 401:
                raise TargetError(f"{url} answered 401 Unauthorized: pass the server's key with --api-key")
            if resp.status != 200:
                return f"GET {url} returned HTTP {resp.status}"
            body = await resp.json(content_type=None)
    except aiohttp.InvalidURL:
        raise TargetError(f"--base-url {base_url}: not a valid http(s) URL") from None
    except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
        raise TargetError(f"cannot reach {base_url}: {exc}") from None
    except ValueError:
        return f"GET {url} did not return JSON"
    models = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
    return [m for m in models if isinstance(m, str)] or f"GET {url} listed no models"


async def resolve_model(base_url: str, backend: str, model: str | None, api_key: str | None) -> str | None:
    """The model name to send: `model` if given, else the first one the server lists (optional for `sglang`)."""
    timeout = aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        served = await _served_models(session, base_url, api_key)
    if model is not None:
        return model
    if isinstance(served, list):
        return served[0]
    if backend == "sglang":
        return None
    raise TargetError(f"{served}; pass --model")
