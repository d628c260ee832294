"""Datasets produce prompts whose token lengths are exactly what they claim."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.bench.datasets import DatasetError, DatasetSpec, build_prompts
from toolkit.bench.datasets.trace import DEFAULT_TRACE, MOONCAKE_BLOCK_TOKENS, read_trace, window
from toolkit.bench.workload import LoadSpec, build_workload

MOONCAKE_SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "mooncake" / "sample.jsonl"


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("range_ratio", [0.0, 0.5, 1.0])
def test_random_prompts_retokenize_to_their_target_lengths(embedded_tokenizer, range_ratio):
    spec = DatasetSpec("random", seed=3, random_input_len=300, random_output_len=40, random_range_ratio=range_ratio)
    prompts = build_prompts(spec, embedded_tokenizer, 150)
    assert len(prompts) == 150
    for p in prompts:
        assert _encode(embedded_tokenizer, p.text) == p.input_ids
        assert len(p.input_ids) == p.input_len
        assert max(int(300 * range_ratio), 1) <= p.input_len <= 300
        assert max(int(40 * range_ratio), 1) <= p.output_len <= 40


def test_random_prompts_are_seeded_and_distinct(embedded_tokenizer):
    spec = DatasetSpec("random", seed=8, random_input_len=64, random_output_len=8)
    a, b = build_prompts(spec, embedded_tokenizer, 20), build_prompts(spec, embedded_tokenizer, 20)
    assert [p.text for p in a] == [p.text for p in b]
    assert len({p.input_ids[0] for p in a}) > 10


def test_generated_shared_prefix_groups_share_exactly_their_system_prompt(embedded_tokenizer):
    spec = DatasetSpec("generated-shared-prefix", seed=1, gsp_num_groups=4, gsp_prompts_per_group=3,
                       gsp_system_prompt_len=64, gsp_question_len=16, gsp_output_len=12)
    prompts = build_prompts(spec, embedded_tokenizer, None)
    assert len(prompts) == 12
    prefixes = [tuple(p.input_ids[:64]) for p in prompts]
    assert sorted(prefixes.count(x) for x in set(prefixes)) == [3, 3, 3, 3]
    assert len({tuple(p.input_ids) for p in prompts}) == 12
    for p in prompts:
        assert (p.input_len, p.output_len) == (80, 12)
        assert _encode(embedded_tokenizer, p.text) == p.input_ids


def test_sharegpt_takes_the_first_exchange_and_measures_it(tmp_path, embedded_tokenizer):
    data = [
        {"conversations": [{"from": "human", "value": "Tell me about the sea and the sky."},
                           {"from": "gpt", "value": "The sea is wide and the sky is blue above it."}]},
        {"conversations": [{"from": "human", "value": "Hi"}]},
        {"conversations": [{"from": "human", "value": "Name three colours please."},
                           {"from": "gpt", "value": "Red, green and blue."}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    prompts = build_prompts(DatasetSpec("sharegpt", path=path), embedded_tokenizer, 4)
    assert len(prompts) == 4 and len({p.text for p in prompts}) == 2
    for p in prompts:
        assert p.input_len == len(_encode(embedded_tokenizer, p.text)) and p.input_ids is None
    by_text = {p.text: p for p in prompts}
    reply = "The sea is wide and the sky is blue above it."
    assert by_text[data[0]["conversations"][0]["value"]].output_len == len(_encode(embedded_tokenizer, reply))
    fixed = build_prompts(DatasetSpec("sharegpt", path=path, sharegpt_output_len=7), embedded_tokenizer, 2)
    assert {p.output_len for p in fixed} == {7}


def test_custom_jsonl_reads_prompts_and_messages(tmp_path, embedded_tokenizer):
    path = tmp_path / "custom.jsonl"
    rows = [{"prompt": "one two three", "output_len": 5},
            {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi you"}]},
            {"prompt": "four", "max_tokens": 9}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = build_prompts(DatasetSpec("custom", path=path), embedded_tokenizer, None)
    assert [p.text for p in prompts] == ["one two three", "hello there", "four"]
    assert [p.output_len for p in prompts] == [5, len(_encode(embedded_tokenizer, "hi you")), 9]
    assert prompts[0].input_len == len(_encode(embedded_tokenizer, "one two three"))


@pytest.mark.parametrize("line, message", [
    ("{not json", "custom.jsonl:2: not JSON"),
    ('{"prompt": "x"}', "no output length"),
    ('{"text": "x", "output_len": 3}', "needs a string 'prompt'"),
    ('{"prompt": "x", "output_len": -1}', "output_len must be a positive integer"),
])
def test_custom_jsonl_errors_name_the_line(tmp_path, embedded_tokenizer, line, message):
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "fine", "output_len": 2}\n' + line + "\n")
    with pytest.raises(DatasetError, match=message):
        build_prompts(DatasetSpec("custom", path=path), embedded_tokenizer, None)


def test_file_datasets_need_an_existing_file(tmp_path, embedded_tokenizer):
    for name in ("sharegpt", "custom"):
        with pytest.raises(DatasetError, match="needs --dataset-path"):
            build_prompts(DatasetSpec(name), embedded_tokenizer, 3)
        with pytest.raises(DatasetError, match="no such file"):
            build_prompts(DatasetSpec(name, path=tmp_path / "missing"), embedded_tokenizer, 3)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        build_prompts(DatasetSpec("nope"), embedded_tokenizer, 3)


def test_the_default_trace_is_the_azure_conversation_trace():
    trace = read_trace(None)
    assert DEFAULT_TRACE.name == "AzureLLMInferenceTrace_conv.csv"
    assert len(trace.offsets) == 19366 and trace.offsets[0] == 0.0
    assert np.all(np.diff(trace.offsets) >= 0) and trace.offsets[-1] == pytest.approx(3501.72, abs=0.01)
    assert (trace.input_lens[0], trace.output_lens[0]) == (374, 44)
    assert trace.offsets[1] == pytest.approx(4.3145790, abs=1e-6)


def test_trace_replay_keeps_timestamps_scaled_and_lengths(embedded_tokenizer):
    spec = DatasetSpec("trace", seed=0, trace_time_scale=0.5)
    workload = build_workload(spec, embedded_tokenizer, LoadSpec(num_prompts=6))
    trace = window(read_trace(None), 6, None)
    assert workload.arrival == "trace"
    assert np.allclose(workload.offsets, trace.offsets * 0.5)
    assert [p.input_len for p in workload.prompts] == list(trace.input_lens)
    assert [p.output_len for p in workload.prompts] == list(trace.output_lens)
    for p in workload.prompts:
        assert len(_encode(embedded_tokenizer, p.text)) == p.input_len
    by_time = build_workload(spec, embedded_tokenizer, LoadSpec(duration=5.0))
    assert len(by_time) == int(np.sum(read_trace(None).offsets * 0.5 < 5.0))


def test_trace_lengths_with_a_synthetic_rate(embedded_tokenizer):
    workload = build_workload(DatasetSpec("trace"), embedded_tokenizer,
                              LoadSpec(rate=4.0, arrival="constant", num_prompts=3))
    assert np.array_equal(workload.offsets, [0.0, 0.25, 0.5]) and workload.arrival == "constant"
    assert [p.input_len for p in workload.prompts] == [374, 396, 879]


def test_mooncake_equal_hash_ids_mean_an_identical_prefix(embedded_tokenizer):
    trace = read_trace(MOONCAKE_SAMPLE)
    workload = build_workload(DatasetSpec("trace", path=MOONCAKE_SAMPLE), embedded_tokenizer,
                              LoadSpec(num_prompts=24))
    assert trace.offsets[1] == pytest.approx(0.716)
    prompts = workload.prompts
    for a in range(len(prompts)):
        for b in range(a):
            ids_a, ids_b = trace.hash_ids[a], trace.hash_ids[b]
            shared = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
            tokens = min(shared * MOONCAKE_BLOCK_TOKENS, prompts[a].input_len, prompts[b].input_len)
            assert prompts[a].input_ids[:tokens] == prompts[b].input_ids[:tokens]
            if shared == 0:
                assert prompts[a].input_ids[:8] != prompts[b].input_ids[:8]
    assert all(len(p.input_ids) == p.input_len for p in prompts)


def test_malformed_traces_are_dataset_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 3}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:1"):
        read_trace(bad)
    csv = tmp_path / "bad.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(DatasetError, match="needs the columns"):
        read_trace(csv)
