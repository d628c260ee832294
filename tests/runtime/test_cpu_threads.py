"""CPU thread counts per step kind, and the overlap and page-size defaults per device."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from toolkit.runtime.cpu_threads import decode_threads
from toolkit.runtime.device_defaults import with_device_defaults
from toolkit.runtime.model_loader.config import load_preset
from toolkit.runtime.server_args import ServerArgs, parse_server_args


def test_decode_runs_on_every_core_by_default(monkeypatch):
    monkeypatch.delenv("TOOLKIT_CPU_DECODE_THREADS", raising=False)
    assert decode_threads(2) == 2
    assert decode_threads(16) == 16


def test_environment_overrides_the_decode_thread_count(monkeypatch):
    monkeypatch.setenv("TOOLKIT_CPU_DECODE_THREADS", "3")
    assert decode_threads(8) == 3
    monkeypatch.setenv("TOOLKIT_CPU_DECODE_THREADS", "0")
    assert decode_threads(8) == 1


@pytest.mark.parametrize(("flags", "disabled"), [
    ([], True),                                # a CPU's default: off
    (["--disable-overlap-schedule"], True),
    (["--enable-overlap-schedule"], False),    # asked for: on, even on a CPU
])
def test_overlap_is_off_on_a_cpu_unless_asked_for(flags, disabled):
    args = with_device_defaults(parse_server_args(["--device", "cpu", *flags]), load_preset("qwen3-0.6b"))
    assert args.disable_overlap_schedule is disabled


def test_the_flag_pair_leaves_the_default_to_the_device():
    assert parse_server_args([]).disable_overlap_schedule is None
    assert ServerArgs().disable_overlap_schedule is None


def test_the_runtime_leaves_openmp_wait_policy_alone():
    """A passive policy (a futex wake-up per op) made decode ~1.5x slower in process: nothing of ours sets it."""
    code = "import os, toolkit.runtime, toolkit.runtime.engine; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "None", out.stderr


@pytest.mark.parametrize(("flags", "page_size"), [([], 16), (["--page-size", "1"], 1), (["--page-size", "64"], 64)])
def test_a_cpu_pages_16_tokens_unless_told(flags, page_size):
    args = with_device_defaults(parse_server_args(["--device", "cpu", *flags]), load_preset("qwen3-0.6b"))
    assert args.page_size == page_size
    assert parse_server_args(flags).page_size == (None if not flags else page_size)
