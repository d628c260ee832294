"""Fixtures for the bench tests: the scripted stub server, in the test's loop or on a thread of its own."""
from __future__ import annotations

import pytest

from tests.bench.stub import Script, StubServer, ThreadedStub


@pytest.fixture
def threaded_stub():
    """A factory: `with threaded_stub(scripts, default=..., api_key=...) as stub:` serves from another thread."""

    def make(scripts: dict[str, Script] | None = None, **kwargs) -> ThreadedStub:
        return ThreadedStub(StubServer(scripts, **kwargs))

    return make
