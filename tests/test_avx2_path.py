"""The machine most users have: an x86-64 CPU with AVX2 and no AVX-512 (AMD EPYC, client CPUs). On any x86 machine
these tests run the product in fresh processes as such a CPU would: oneDNN capped at AVX2 (`ONEDNN_MAX_CPU_ISA`,
so no bf16 GEMMs, no AMX), ATen and MKL at AVX2, the native kernels built for the x86-64-v3 tier. With default
flags the server starts, says what it chose, and answers exactly as transformers does in float32; the engine's
parity and forced-retraction tests pass. The demo runs on this path in tests/test_demo.py (where the cap adds
coverage), so it runs once a session.

On a CPU that is itself such a machine (kernel tier x86-64-v3, no native bf16, nothing capped) the capped
environment changes nothing, so the parity run here would repeat, to the byte, tests the rest of the suite runs in
the same session; it runs where it adds coverage (AVX-512 and AMX machines) only."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from tests.avx2_machine import AVX2_ENV, HAS_AVX2, IS_AVX2_HOST
from tests.conftest import SHARED_FOLDER_ENV, shared_folder
from tests.server.server_process import ServerProcess

NEW_TOKENS = 16

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_AVX2, reason="needs an x86-64 CPU with AVX2 (x86-64-v3) to run its AVX2 path"),
]
same_as_the_main_suite = pytest.mark.skipif(
    IS_AVX2_HOST, reason="this CPU is an AVX2 machine: the main suite ran these tests on the AVX2 path already")


@pytest.fixture
def avx2_env(monkeypatch):
    for name, value in AVX2_ENV.items():
        monkeypatch.setenv(name, value)
    return {**os.environ, **AVX2_ENV}


def test_serve_with_default_flags_starts_on_avx2_says_so_and_matches_transformers(
        avx2_env, tmp_path, chat_prompt_ids, embedded_greedy):
    server = ServerProcess(log_file=tmp_path / "server.log").wait_healthy()
    try:
        answer = requests.post(f"{server.url}/generate", timeout=300, json={
            "input_ids": chat_prompt_ids,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}}).json()
    finally:
        server.stop()
    output = server.output()
    assert "CPU: " in output and "ISA avx2 (kernel tier x86-64-v3, oneDNN capped at AVX2)" in output, output[-3000:]
    assert "oneDNN bf16: no" in output and "-> dtype float32" in output
    assert "Traceback" not in output
    for prompt, result in zip(chat_prompt_ids, answer):
        assert result["output_ids"] == embedded_greedy(prompt, NEW_TOKENS)


def test_an_explicit_bfloat16_runs_unpacked_and_says_so_once(avx2_env, tmp_path):
    server = ServerProcess("--dtype", "bfloat16").wait_healthy()
    try:
        reply = requests.post(f"{server.url}/generate", timeout=300, json={
            "text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}})
    finally:
        server.stop()
    assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 4
    output = server.output()
    assert output.count("oneDNN has no native bfloat16 GEMM on this CPU (ISA avx2)") == 1, output[-3000:]
    assert "dtype bfloat16" in output and "Traceback" not in output


@same_as_the_main_suite
def test_engine_parity_and_forced_retraction_tests_pass_on_the_avx2_path(avx2_env, tmp_path_factory):
    selection = ["tests/runtime/test_engine_embedded.py::test_greedy_chat_batch_equals_transformers",
                 "tests/runtime/test_engine_greedy.py::test_forced_retraction_keeps_greedy_output_identical",
                 "tests/runtime/test_model_parity.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
                          capture_output=True, text=True, timeout=900,
                          env={**avx2_env, SHARED_FOLDER_ENV: str(shared_folder(tmp_path_factory))})
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
