"""--allow-auto-truncate: a prompt longer than the context is cut (SGLang keeps its head, leaving room for
max_new_tokens) and served as that head would be; without the flag the same request is a 400 naming the prompt."""
from __future__ import annotations

import pytest
import requests

from tests.server.server_process import ServerProcess

CONTEXT, NEW = 128, 8
LONG_IDS = [1000 + (i * 37) % 9000 for i in range(300)]
KEPT = CONTEXT - NEW - 1  # the head that fits with room for the new tokens


@pytest.fixture(scope="module", params=[True, False], ids=["truncating", "strict"])
def short_context_server(request):
    flags = ["--device", "cpu", "--dtype", "float32", "--context-length", str(CONTEXT)]
    process = ServerProcess(*flags, *(["--allow-auto-truncate"] if request.param else [])).wait_healthy()
    yield request.param, process
    process.stop()


def _generate(server, ids: list[int], max_new: int = NEW) -> requests.Response:
    return requests.post(f"{server.url}/generate", timeout=120, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}})


def test_long_prompt_is_cut_to_its_head_or_refused(short_context_server):
    truncating, server = short_context_server
    response = _generate(server, LONG_IDS)
    if not truncating:
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "input_ids" and "longer than the model's context length (128 tokens)" in error[
            "message"]
        return
    assert response.status_code == 200, response.text
    cut = response.json()
    assert cut["meta_info"]["prompt_tokens"] == KEPT
    head = _generate(server, LONG_IDS[:KEPT]).json()
    assert cut["output_ids"] == head["output_ids"] and len(cut["output_ids"]) == NEW
    assert cut["text"] == head["text"]


def test_openai_text_prompt_is_cut_or_refused(short_context_server):
    truncating, server = short_context_server
    prompt = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens
    response = requests.post(f"{server.url}/v1/completions", timeout=120,
                             json={"prompt": prompt, "max_tokens": NEW, "temperature": 0})
    if truncating:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] == KEPT
    else:
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_no_cut_leaves_room_when_max_tokens_fills_the_context(short_context_server):
    """Truncation cannot help a request whose max_tokens alone needs the whole context: still a 400."""
    _, server = short_context_server
    response = _generate(server, LONG_IDS, max_new=CONTEXT - 1)
    assert response.status_code == 400 and "context length" in response.json()["error"]["message"]
