"""--log-requests: each request's inputs when it arrives and its output when it finishes, in the server log (the
shared keyed server runs with it)."""
from __future__ import annotations

import re
import time

import requests

from tests.server.conftest import API_KEY


def _log_lines_of(server, rid: str, deadline_s: float = 10.0) -> list[str]:
    """The log lines naming `rid`, once its Finish line is there (bounded wait: the log is flushed per line)."""
    deadline = time.monotonic() + deadline_s
    while True:
        lines = [line for line in server.log_file.read_text().splitlines() if f"rid={rid}" in line]
        if any("Finish:" in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_each_request_is_logged_with_its_inputs_and_its_output(keyed_server):
    body = {"input_ids": [1, 2, 3, 4],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    response = requests.post(f"{keyed_server.url}/generate", json=body, timeout=60,
                             headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200, response.text
    result = response.json()
    lines = _log_lines_of(keyed_server, result["meta_info"]["id"])
    receive = [line for line in lines if "Receive:" in line]
    finish = [line for line in lines if "Finish:" in line]
    assert len(receive) == 1 and "input_ids=[1, 2, 3, 4]" in receive[0] and "max_new_tokens=4" in receive[0]
    assert len(finish) == 1 and "completion_tokens=4" in finish[0], lines
    assert re.search(r"out=(['\"])(.*)\1$", finish[0]).group(2) == repr(result["text"])[1:-1]
    assert API_KEY not in "\n".join(lines)
