"""Requests whose grammar is compiling wait here, off the scheduler's step (SGLang's grammar queue): a worker
thread compiles each grammar once, the cache keeps it by key (kind, text, strictness), and a request moves on to
the waiting queue with its own matcher once its grammar is ready, or is refused when it is invalid or its compile
runs past the bound (the cache then remembers the refusal)."""
from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, NamedTuple

from toolkit.runtime.constrained.backend import GrammarBackend, GrammarError, RequestGrammar
from toolkit.runtime.constrained.spec import GrammarSpec

CACHE_ENTRIES = 256


class Resolved(NamedTuple):
    """A request leaving the queue: its matcher, or why its grammar was refused."""

    rid: str
    grammar: RequestGrammar | None
    error: str | None


@dataclass
class _Pending:
    rid: str
    spec: GrammarSpec
    future: Future


class GrammarQueue:
    def __init__(self, backend: GrammarBackend, timeout_s: float, cache_entries: int = CACHE_ENTRIES) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self.cache_entries = cache_entries
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._executor = _executor()
        self._pending: dict[str, _Pending] = {}
        self._started: dict[GrammarSpec, float] = {}  # when each compile began on the worker thread
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, rid: str, spec: GrammarSpec, at_once: bool = True) -> RequestGrammar | None:
        """The request's matcher at once when its grammar is compiled already (and `at_once`); else None, and it
        waits here. Under TP `at_once` is False: each rank's compile may finish at another time, so every request
        goes through the queue and rank 0's verdicts."""
        future = self._compiled(spec)
        if at_once and future.done() and future.exception() is None:
            return self.backend.matcher(future.result())
        self._pending[rid] = _Pending(rid, spec, future)
        return None

    def _compiled(self, spec: GrammarSpec) -> Future:
        future = self._cache.get(spec)
        if future is not None:
            self.hits += 1
            self._cache.move_to_end(spec)
            return future
        self.misses += 1
        future = self._executor.submit(self._compile, spec)
        self._cache[spec] = future
        if len(self._cache) > self.cache_entries:
            self._cache.popitem(last=False)
        return future

    def _compile(self, spec: GrammarSpec) -> Any:
        self._started[spec] = time.monotonic()
        try:
            return self.backend.compile(spec)
        finally:
            self._started.pop(spec, None)

    def _overdue(self, pending: _Pending, now: float) -> bool:
        """Compiling for longer than the bound (time spent queued behind other compiles does not count)."""
        started = self._started.get(pending.spec)
        return started is not None and not pending.future.done() and now - started >= self.timeout_s

    def remove(self, rid: str) -> bool:
        """Drop an aborted request; True when it was here."""
        return self._pending.pop(rid, None) is not None

    def ready(self, now: float | None = None) -> list[Resolved]:
        """The requests whose grammar compiled, failed or ran past the bound, in arrival order."""
        now = time.monotonic() if now is None else now
        out = [self._resolve(p) for p in self._pending.values() if p.future.done() or self._overdue(p, now)]
        for item in out:
            del self._pending[item.rid]
        return out

    def resolve(self, rid: str, error: str | None) -> Resolved:
        """The request as another rank decided it (TP followers take the leader's verdict, waiting for their own
        compile of a grammar the leader found ready)."""
        pending = self._pending.pop(rid)
        if error is not None:
            return Resolved(rid, None, error)
        return Resolved(rid, self.backend.matcher(pending.future.result(timeout=self.timeout_s)), None)

    def _resolve(self, pending: _Pending) -> Resolved:
        future = pending.future
        if not future.done():
            message = (f"invalid {pending.spec.label}: compiling it took longer than {self.timeout_s:g} s "
                       "(--grammar-compile-timeout)")
            self._remember_failure(pending.spec, future, GrammarError(message))
            self._started.pop(pending.spec, None)
            self._replace_executor()
            return Resolved(pending.rid, None, message)
        exc = future.exception()
        if exc is None:
            return Resolved(pending.rid, self.backend.matcher(future.result()), None)
        if isinstance(exc, GrammarError):
            return Resolved(pending.rid, None, str(exc))
        return Resolved(pending.rid, None, f"invalid {pending.spec.label}: {type(exc).__name__}: {exc}"[:500])

    def _remember_failure(self, spec: GrammarSpec, running: Future, error: GrammarError) -> None:
        if self._cache.get(spec) is running:
            failed: Future = Future()
            failed.set_exception(error)
            self._cache[spec] = failed

    def _replace_executor(self) -> None:
        """A compile past the bound keeps its thread (a compile cannot be interrupted): the grammars queued behind
        it move to a fresh thread."""
        old, self._executor = self._executor, _executor()
        old.shutdown(wait=False)
        for spec, future in list(self._cache.items()):
            if future.cancel():
                moved = self._executor.submit(self._compile, spec)
                self._cache[spec] = moved
                for pending in self._pending.values():
                    if pending.future is future:
                        pending.future = moved

    def wait(self, timeout_s: float) -> None:
        """Block up to `timeout_s` for a compile to finish (a scheduler with nothing else to do)."""
        futures = [p.future for p in self._pending.values() if not p.future.done()]
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)




def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="toolkit-grammar")
