"""A stand-in for `python -m sglang.launch_server` in the tests: a server of known capacity that is not ours.

It takes SGLang's flags that matter here, answers `/health`, `/v1/models` and `/generate` (the bench tests' stub
with `capacity=--max-running-requests`: that many requests are served at once, each in `SERVICE_S`, the rest
queue), and prints SGLang 0.4.9's log lines to stdout — `server_args`, the start-up lines, and a decode line every
`LOG_EVERY_S` while requests are in flight — so `tune --launch` reads the log from the command's output.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

from aiohttp import web

from tests.bench.stub import Script, StubServer
from tests.diagnose import logfactory as lf

SERVICE = Script(ttft=0.04, chunks=((0.0, 1), (0.03, 1), (0.03, 1)))
SERVICE_S = 0.1
LOG_EVERY_S = 0.1
POOL = 100_000
HELD = 22_500  # NOTE: tokens a running request holds: at a 0.9 usage the pool holds 4, the cap diagnose sizes to


def log(message: str) -> None:
    print(time.strftime("[%Y-%m-%d %H:%M:%S] ", time.localtime()) + message, flush=True)


class FakeSGLang(StubServer):
    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/health", lambda request: web.Response(text="ok"))
        return app


async def _log_batches(stub: FakeSGLang) -> None:
    while True:
        await asyncio.sleep(LOG_EVERY_S)
        if stub.in_flight:
            running, queued = stub.serving, stub.in_flight - stub.serving
            log(lf.decode("0.4.9", running=running, token=running * HELD, usage=running * HELD / POOL,
                          throughput=running / SERVICE_S * 3, queue=queued))


async def serve(args: argparse.Namespace) -> None:
    stub = FakeSGLang(default=SERVICE, capacity=args.max_running_requests)
    stub.port, stub.base_url = args.port, f"http://{args.host}:{args.port}"
    log(lf.server_args(model_path=args.model_path, host=args.host, port=args.port,
                       max_running_requests=args.max_running_requests,
                       schedule_conservativeness=args.schedule_conservativeness, enable_torch_compile=True))
    for line in lf.startup("0.4.9", lf.Startup(max_total=POOL, max_running=args.max_running_requests)):
        log(line)
    await stub.start()
    logger = asyncio.ensure_future(_log_batches(stub))
    try:
        await asyncio.Event().wait()
    finally:
        logger.cancel()
        await stub.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fake_sglang")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-running-requests", type=int, default=4)
    parser.add_argument("--schedule-conservativeness", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
