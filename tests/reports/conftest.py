"""Fixtures for the report tests: real `toolkit bench` records and an SGLang log written around their window.

The bench runs against the bench tests' stub server, which here answers every fourth request with an HTML error
body; the log (tests/diagnose's era factory) carries `<script>` in a server argument, in an exception and in an
unreadable line, so the page must show all of them as text.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner

from toolkit.diagnose.bench_input import to_log_clock
from tests.bench.stub import StubServer, ThreadedStub
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup
from toolkit.cli import app

ERA = "0.4.9"
ERROR_BODY = "<b>upstream exploded</b>"
EVIL_MODEL = "<script>document.title='pwned'</script>"
EVIL_ERROR = "ValueError: <script>window.__pwned=1</script>"
EVIL_UNREAD = "Decode batch. <script>window.__pwned_unread=1</script>"
RATES = (50.0, 100.0, 200.0)
SECTION_IDS = ("config", "verdict", "tables", "sweep", "timeline", "diagnosis")


class FailingStub(StubServer):
    """The stub, except that every `every`-th request gets an HTTP 500 with an HTML body (as a proxy sends)."""

    def __init__(self, every: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.every, self.count = every, 0

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        self.count += 1
        if self.count % self.every == 0:
            return web.Response(status=500, text=ERROR_BODY, content_type="text/html")
        return await super()._stream(request)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_log(records: list[dict], path: Path, *, margin_s: float = 60.0, every_s: float = 0.3) -> Path:
    """A steady, retracting server from `margin_s` before the runs to `margin_s` after; the evil lines fall
    inside the runs' window."""
    t0 = to_log_clock(min(r["started_at"] for r in records))
    t1 = to_log_clock(max(r["ended_at"] for r in records))
    log = Log(ERA, t=t0 - margin_s).start(Startup(available=12.0), model_path=EVIL_MODEL, tp_size=1,
                                          mem_fraction_static=0.85)
    i, evil_written = 0, False
    while log.t < t1 + margin_s:
        log.add(lf.prefill(ERA, new_seq=1, new_token=500, cached=100, running=100, queue=5, usage=0.9,
                           token=600000), dt=every_s / 3)
        log.add(lf.decode(ERA, running=96 + i % 9, token=600000, usage=0.88 + 0.01 * (i % 5),
                          throughput=2900 + 40 * (i % 7), queue=3 + i % 4), dt=every_s * 2 / 3)
        if i % 3 == 0:
            log.add(lf.retract(ERA, k=1, old=0.5, new=0.8))
        if not evil_written and log.t >= t0:
            log.add(f"Scheduler hit an exception: Traceback (most recent call last):\n{EVIL_ERROR}")
            log.add(EVIL_UNREAD)
            evil_written = True
        i += 1
    path.write_text(log.text())
    return path


@pytest.fixture(scope="session")
def bench_file(tmp_path_factory) -> Path:
    """A real rate list (50, 100, 200 req/s) with `--output-details`, one record per rate."""
    out = tmp_path_factory.mktemp("bench") / "runs.jsonl"
    with ThreadedStub(FailingStub()) as stub:
        args = ["bench", "--base-url", stub.base_url, "--dataset", "random", "--random-input-len", "16",
                "--random-output-len", "4", "--seed", "3", "--num-prompts", "8", "--rate",
                ",".join(f"{r:g}" for r in RATES), "--output-details", "--output-file", str(out),
                "--server-log", "server.log", "--no-progress"]
        # NOTE: a thread of its own, so bench's event loop never meets one already running (Playwright's).
        with ThreadPoolExecutor(1) as pool:
            result = pool.submit(CliRunner().invoke, app, args).result(timeout=120)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def records(bench_file) -> list[dict]:
    return read_jsonl(bench_file)


@pytest.fixture(scope="session")
def server_log(records, tmp_path_factory) -> Path:
    return write_log(records, tmp_path_factory.mktemp("log") / "server.log")


@pytest.fixture(scope="session")
def report_file(records, server_log, bench_file, tmp_path_factory) -> Path:
    from toolkit.reports import build_report

    out = tmp_path_factory.mktemp("report") / "report.html"
    return build_report(records, server_log, out, title="Stub sweep", bench_sources=[str(bench_file)])


@pytest.fixture(scope="session")
def report_html(report_file) -> str:
    return report_file.read_text(encoding="utf-8")
