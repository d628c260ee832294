"""`--scrape-metrics`: samples the server's Prometheus `/metrics` (SGLang or vLLM names) while a run goes on."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from time import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

PREFIXES = ("sglang:", "vllm:")
AVERAGED = ("token_usage", "cache_hit_rate")


def parse_metrics(text: str) -> dict[str, float]:
    """Server metrics by sample name, summed over label sets (averaged for ratios); histogram buckets dropped."""
    values: dict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIXES):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                values[sample.name].append(sample.value)
    return {
        name: sum(v) / len(v) if name.endswith(AVERAGED) else sum(v)
        for name, v in values.items()
    }


class MetricsScraper:
    """Polls `/metrics` every `interval` seconds; `samples` holds `{"t": unix seconds, "metrics": {...}}` rows."""

    def __init__(self, base_url: str, headers: dict[str, str], interval: float = 1.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.headers = headers
        self.interval = interval
        self.samples: list[dict] = []
        self.error: str | None = None

    async def sample(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url, headers=self.headers) as resp:
                if resp.status != 200:
                    self.error = f"GET {self.url} returned HTTP {resp.status}"
                    return
                text = await resp.text()
            self.samples.append({"t": time(), "metrics": parse_metrics(text)})
        except ValueError:
            self.error = f"GET {self.url} did not return Prometheus text"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.error = f"GET {self.url} failed: {type(exc).__name__}: {exc}"

    async def run(self) -> None:
        """Sample until cancelled, and once more on the way out so the run's end is covered."""
        timeout = aiohttp.ClientTimeout(total=max(self.interval, 5.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                while self.error is None:
                    await self.sample(session)
                    await asyncio.sleep(self.interval)
            except asyncio.CancelledError:
                if self.error is None:
                    await asyncio.shield(self.sample(session))
