"""Shared servers for the API tests: one plain (embedded model, metrics and log file on), one behind an API key
(which also logs its requests)."""
from __future__ import annotations

import pytest

from tests.server.server_process import ServerProcess

# NOTE: --device cpu: the tests below read CPU facts from its log (`cuda graph: False`, `available_cpu_mem`).
SERVER_FLAGS = ("--device", "cpu", "--dtype", "float32", "--enable-metrics", "--decode-log-interval", "5",
                "--max-total-tokens", "20000", "--enable-cache-report")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    log_file = tmp_path_factory.mktemp("server") / "server.log"
    process = ServerProcess(*SERVER_FLAGS, log_file=log_file).wait_healthy()
    yield process
    process.stop()


API_KEY = "sk-test-123"


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory):
    log_file = tmp_path_factory.mktemp("keyed") / "server.log"
    # NOTE: --log-requests too: the logged requests must not leak the key either
    process = ServerProcess("--max-total-tokens", "4096", "--api-key", API_KEY,
                            "--log-requests", log_file=log_file).wait_healthy()
    yield process
    process.stop()
