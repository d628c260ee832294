"""Kills the scheduler process when one step (a forward pass) runs longer than --watchdog-timeout."""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

logger = logging.getLogger("runtime")


class Watchdog:
    def __init__(self, timeout: float, describe: Callable[[], str] = lambda: "") -> None:
        self.watchdog_timeout = timeout
        self._describe = describe
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def armed(self) -> Iterator[None]:
        self._started = time.monotonic()
        try:
            yield
        finally:
            self._started = None

    def _watch(self) -> None:
        interval = min(1.0, self.watchdog_timeout / 4)
        while not self._stop.wait(interval):
            started = self._started
            if started is not None and time.monotonic() - started > self.watchdog_timeout:
                self._fire()

    def _fire(self) -> None:
        logger.error(f"Watchdog timeout (self.watchdog_timeout={self.watchdog_timeout})")
        logger.error(f"Stuck batch: {self._describe()}")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for handler in logging.getLogger("runtime").handlers:
            handler.flush()
        os._exit(1)

    def stop(self) -> None:
        self._stop.set()
