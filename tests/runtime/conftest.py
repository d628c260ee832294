"""Fixtures shared by the runtime tests."""
from __future__ import annotations

import pytest


@pytest.fixture(params=[True, False], ids=["overlap", "no-overlap"])
def overlap(request) -> bool:
    """Scheduling with one step in flight (SGLang's overlap scheduler) and without: outputs must not differ."""
    return request.param
