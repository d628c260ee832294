"""benchmarks.vs_vllm without a peer run: its variant flags, the environment words of a variant, and the refusal to
print a ratio when vLLM-CPU is not set up."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import vs_vllm

REPO = Path(__file__).resolve().parents[2]


def test_variants_repeat_and_keep_their_leading_dashes():
    args = vs_vllm.parse_args(["--rates", "inf", "--toolkit-variant=--disable-overlap-schedule",
                               "--toolkit-variant=TOOLKIT_CPU_DECODE_THREADS=2 --disable-overlap-schedule"])
    assert args.rates == ["inf"]
    assert args.toolkit_variants == ["--disable-overlap-schedule",
                                     "TOOLKIT_CPU_DECODE_THREADS=2 --disable-overlap-schedule"]


def test_key_value_words_become_the_server_environment_and_flags_stay_flags(tmp_path):
    command, env = vs_vllm.toolkit_launch(["TOOLKIT_CPU_DECODE_THREADS=2", "--disable-overlap-schedule",
                                           "--chunked-prefill-size=512"], 12345, tmp_path / "log")
    assert env == {"TOOLKIT_CPU_DECODE_THREADS": "2"}
    assert "--disable-overlap-schedule" in command and "--chunked-prefill-size=512" in command
    assert not any(word.startswith("TOOLKIT_") for word in command)


def test_without_vllm_it_says_so_and_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.vs_vllm", "--peers-root", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "vLLM-CPU is not set up here" in done.stderr and "No ratio" in done.stderr
    assert "x |" not in done.stdout
