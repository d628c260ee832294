"""`toolkit bench-offline`: prompts through the in-process engine, throughput printed and appended as JSON."""
from __future__ import annotations

import json
import time

import pytest

from toolkit.bench.offline import main
from toolkit.runtime.engine import Engine
from benchmarks.scheduler_overhead import TINY_LLAMA

TINY = ["--model-path", "llama-3.2-1b", "--load-format", "dummy", "--json-model-override-args",
        json.dumps(TINY_LLAMA), "--dtype", "float32", "--log-level", "warning"]


def test_random_prompts_run_and_record_throughput(tmp_path, capsys, monkeypatch):
    """The record's counts are the engine's own outputs, and its latency is the timed generate call's (not the
    engine's load or the warm-up), measured here from outside that call."""
    calls = []
    generate = Engine.generate

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        results = generate(self, *args, **kwargs)
        calls.append((time.perf_counter() - started, results))
        return results

    monkeypatch.setattr(Engine, "generate", timed)
    out = tmp_path / "offline.jsonl"
    code = main([*TINY, "--num-prompts", "5", "--random-input-len", "20", "--random-output-len", "7",
                 "--output-file", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    (_, warmup), (seconds, results) = calls
    assert len(warmup[0]["output_ids"]) == 2 and len(results) == record["successful_requests"] == 5
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    assert (record["total_input_tokens"], record["total_output_tokens"]) == (100, completion) == (100, 35)
    # the record's clock starts before the call and stops after it: never shorter, and no more than the 0.1 s
    # (ample) of bookkeeping around it
    assert seconds <= record["total_latency"] <= seconds + 0.1
    assert 35 / (seconds + 0.1) <= record["output_throughput"] <= 35 / seconds
    assert record["input_throughput"] == pytest.approx(100 / 35 * record["output_throughput"])
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
