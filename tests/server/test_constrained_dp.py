"""Constrained decoding under `--dp-size 2`: each replica compiles and masks on its own; mixed requests sent at
once, spread over both replicas, are valid and equal their one-at-a-time answers; the grammar queue gauge has a
series per replica and their total."""
from __future__ import annotations

import concurrent.futures
import re

import pytest
import requests

from tests.server.server_process import ServerProcess
from tests.server.test_constrained_api import _answer, _mixed_requests, _valid

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)


@pytest.fixture(scope="module")
def dp_api():
    process = ServerProcess("--device", "cpu", "--dtype", "float32", "--max-total-tokens", "4000", "--dp-size", "2",
                            "--enable-metrics").wait_healthy()
    yield process
    process.stop()


def test_mixed_constrained_requests_over_two_replicas(dp_api):
    batch = _mixed_requests()
    alone = [_answer(dp_api, path, body) for path, body, _ in batch]
    for (path, body, kind), answer in zip(batch, alone):
        _valid(kind, path, answer, body)
    with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
        assert list(pool.map(lambda r: _answer(dp_api, r[0], r[1]), batch)) == alone
    metrics = requests.get(dp_api.url + "/metrics", timeout=30).text
    ranks = set(re.findall(r'^sglang:num_grammar_queue_reqs\{dp_rank="([^"]+)"', metrics, re.M))
    assert ranks == {"0", "1", "all"}
