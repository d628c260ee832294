"""`toolkit bench-offline`: prompts through the in-process engine, throughput printed and appended as JSON."""
from __future__ import annotations

import json

import pytest

from toolkit.bench.offline import main
from benchmarks.scheduler_overhead import TINY_LLAMA

TINY = ["--model-path", "llama-3.2-1b", "--load-format", "dummy", "--json-model-override-args",
        json.dumps(TINY_LLAMA), "--dtype", "float32", "--log-level", "warning"]


def test_random_prompts_run_and_record_throughput(tmp_path, capsys):
    out = tmp_path / "offline.jsonl"
    code = main([*TINY, "--num-prompts", "5", "--random-input-len", "20", "--random-output-len", "7",
                 "--output-file", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["successful_requests"] == 5
    assert (record["total_input_tokens"], record["total_output_tokens"]) == (100, 35)
    assert record["output_throughput"] == pytest.approx(35 / record["total_latency"])
    assert "output_throughput" in capsys.readouterr().out


def test_jsonl_prompts_keep_their_output_lengths(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello there", "output_len": 3}\n'
                       '{"messages": [{"role": "user", "content": "Hi!"}], "output_len": 2}\n')
    out = tmp_path / "offline.jsonl"
    assert main([*TINY, "--dataset-path", str(prompts), "--output-file", str(out)]) == 0
    assert json.loads(out.read_text())["total_output_tokens"] == 5


def test_bad_arguments_exit_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--dataset-path", str(tmp_path / "missing.jsonl")])
    assert exit_info.value.code == 2 and "no such file" in capsys.readouterr().err
