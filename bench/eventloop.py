"""The event loop for a run: uvloop when installed (cheaper I/O callbacks on the hot path), else asyncio's own."""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


@contextlib.contextmanager
def on_ctrl_c(callback: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGINT calls `callback` on the running loop instead of raising KeyboardInterrupt; outside the
    main thread (or without signal support) SIGINT is left as it is."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        # NOTE: the loop puts back Python's default (KeyboardInterrupt), not what was there: a worker that ignored
        # Ctrl-C before its run ignores it again, so a second Ctrl-C (a terminal's to the group, and the parent's
        # pass-on) after its run cannot lose its samples.
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
