"""Tensor parallelism through the offline Engine on CPU (gloo, float32): greedy output with the model sharded over
2 (or 3) ranks equals one rank's, token for token, and transformers'; KV heads fewer than the ranks are replicated;
sizes that cannot split the heads are refused by name; a lost or missing rank is named within a bounded time."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from tests.machine_speed import scaled
from tests.conftest import reference_greedy
from tests.runtime.engine_fixtures import FORCED_RETRACTION, LogCapture, random_prompts, retraction_lines, tiny_engine
from tests.runtime.tiny_models import make_tiny_model
from toolkit.runtime import Engine
from toolkit.runtime.distributed.group import DistributedError, TPGroup
from toolkit.runtime.distributed.topology import RankInfo, free_port
from toolkit.runtime.model_loader.errors import ModelLoadError

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

NEW_TOKENS = 10
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    """4 heads, 2 KV heads: both split by 2."""
    folder = tmp_path_factory.mktemp("tp-llama")
    return folder, make_tiny_model("llama-gqa-llama3rope", folder, seed=7)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(8, vocab=320, seed=11)


def _generate(engine: Engine, prompts, params=GREEDY) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]


def test_tp2_greedy_equals_tp1_and_transformers(gqa_model, prompts, overlap):
    folder, reference = gqa_model
    expected = [reference_greedy(reference, p, NEW_TOKENS) for p in prompts]
    single = tiny_engine(folder, disable_overlap_schedule=not overlap)
    try:
        assert _generate(single, prompts) == expected
    finally:
        single.shutdown()
    engine = tiny_engine(folder, tp_size=2, disable_overlap_schedule=not overlap, log_level="info")
    try:
        with LogCapture() as log:
            assert _generate(engine, prompts) == expected
            # a second round hits the radix cache on every rank alike
            assert _generate(engine, prompts) == expected
        assert engine.check_memory() and engine.flush_cache()
        assert any(line.startswith("Prefill batch.") for line in log.lines)
        assert engine.runner.num_kv_heads == 1 and engine.runner.model.model.layers[0].self_attn.num_heads == 2
    finally:
        engine.shutdown()
    assert not engine.followers.any_alive()


@pytest.mark.parametrize("page_size", [1, 16])
def test_tp2_greedy_survives_chunking_paging_and_forced_retraction(gqa_model, page_size):
    """Every rank takes the same scheduling decisions: a tiny pool forces retractions, chunks split the prompts."""
    folder, reference = gqa_model
    prompts = random_prompts(16, vocab=320, seed=11)
    expected = [reference_greedy(reference, p, 40) for p in prompts]
    engine = tiny_engine(folder, tp_size=2, page_size=page_size, log_level="info", **FORCED_RETRACTION)
    try:
        with LogCapture() as log:
            outputs = _generate(engine, prompts, {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True})
        assert outputs == expected
        assert engine.check_memory()
    finally:
        engine.shutdown()
    assert retraction_lines(log.lines)


def test_tp_halves_each_ranks_weights_and_kv_heads(gqa_model):
    folder, _ = gqa_model
    single = tiny_engine(folder)
    sharded = tiny_engine(folder, tp_size=2)
    try:
        one, two = single.runner, sharded.runner
        assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
        layer_one, layer_two = one.model.model.layers[0], two.model.model.layers[0]
        assert layer_two.mlp.gate_up_proj.weight.shape[0] * 2 == layer_one.mlp.gate_up_proj.weight.shape[0]
        assert layer_two.self_attn.o_proj.weight.shape[1] * 2 == layer_one.self_attn.o_proj.weight.shape[1]
        assert two.model.lm_head.weight.shape[0] * 2 == one.model.lm_head.weight.shape[0]
        assert two.max_total_num_tokens == one.max_total_num_tokens  # --max-total-tokens, the same on every rank
    finally:
        sharded.shutdown()
        single.shutdown()


def test_tp_ranks_on_one_cpu_share_its_kv_budget(gqa_model, monkeypatch):
    """Each of 2 ranks holds half the KV heads in half the host's budget: the same tokens as one process, within
    what the smaller weights of a rank leave (the budget of rank 0 here, 25% of a pretend 0.02 GiB of free RAM
    after its weights, their oneDNN-packed copies included, which double them; the pool is the ranks' minimum)."""
    from toolkit.runtime import model_runner

    folder, _ = gqa_model
    monkeypatch.setattr(model_runner, "available_memory_gib", lambda device: 0.02)
    sizes = []
    for tp_size in (1, 2):
        engine = tiny_engine(folder, tp_size=tp_size, max_total_tokens=None)
        try:
            sizes.append(engine.runner.max_total_num_tokens)
        finally:
            engine.shutdown()
    assert sizes[0] > 1000 and abs(sizes[1] - sizes[0]) <= 0.04 * sizes[0]


def test_seeded_sampling_under_tp_equals_one_rank(gqa_model, prompts):
    folder, _ = gqa_model
    params = [{"max_new_tokens": 8, "temperature": 0.9, "top_p": 0.95, "seed": 100 + i, "ignore_eos": True}
              for i in range(len(prompts))]
    single = tiny_engine(folder)
    try:
        expected = _generate(single, prompts, params)
    finally:
        single.shutdown()
    engine = tiny_engine(folder, tp_size=2)
    try:
        assert _generate(engine, prompts, params) == expected
    finally:
        engine.shutdown()


def test_unseeded_sampling_under_tp_scores_as_transformers_scores_its_tokens(gqa_model, prompts):
    """Rank 0 samples and every rank takes its tokens: were a rank to draw its own, its shard would run on other
    tokens and the logprobs of what rank 0 returns would stop matching the model's."""
    folder, reference = gqa_model
    engine = tiny_engine(folder, tp_size=2)
    try:
        results = engine.generate(input_ids=prompts[:4], return_logprob=True, sampling_params={
            "max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True})
    finally:
        engine.shutdown()
    for prompt, result in zip(prompts[:4], results):
        ids = prompt + result["output_ids"]
        with torch.no_grad():
            logprobs = torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)
        for i, (logprob, token) in enumerate(result["meta_info"]["output_token_logprobs"]):
            assert abs(logprob - logprobs[len(prompt) - 1 + i, token].item()) < 1e-3


def test_kv_heads_fewer_than_ranks_are_replicated(tmp_path, prompts):
    reference = make_tiny_model("qwen2-bias", tmp_path, seed=3)  # 4 heads, 1 KV head, qkv bias
    engine = tiny_engine(tmp_path, tp_size=2)
    try:
        assert engine.runner.num_kv_heads == 1
        assert _generate(engine, prompts[:4]) == [reference_greedy(reference, p, NEW_TOKENS) for p in prompts[:4]]
    finally:
        engine.shutdown()


def test_embedded_model_tp3_equals_tp1(chat_prompt_ids, embedded_greedy):
    """SmolLM2-135M: 9 heads and 3 KV heads split by 3 (three processes on this host)."""
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    expected = [embedded_greedy(p, 12) for p in chat_prompt_ids]
    engine = Engine(dtype="float32", device="cpu", max_total_tokens=4096, max_running_requests=8, tp_size=3,
                    log_level="warning")
    try:
        assert engine.runner.model.model.layers[0].self_attn.num_heads == 3
        assert _generate(engine, chat_prompt_ids, params) == expected
    finally:
        engine.shutdown()


def test_embedded_model_refuses_tp2_naming_its_head_counts():
    started = time.monotonic()
    with pytest.raises(ModelLoadError, match=r"--tp-size 2: LlamaForCausalLM has 9 attention heads and 3 KV heads.*"
                                             r"TP sizes that work: 1, 3$"):
        Engine(dtype="float32", device="cpu", tp_size=2, log_level="warning")
    assert time.monotonic() - started < scaled(60)


@pytest.mark.parametrize("flags, message", [
    ({"tp_size": 0}, "--tp-size must be >= 1"),
    ({"tp_size": -2}, "--tp-size must be >= 1"),
    ({"dp_size": 0}, "--dp-size must be >= 1"),
    ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "127.0.0.1:5000"}, "must be a multiple of --nnodes 2"),
    ({"nnodes": 2, "tp_size": 2}, "--nnodes 2 needs --dist-init-addr"),
    ({"nnodes": 2, "tp_size": 2, "node_rank": 2, "dist_init_addr": "127.0.0.1:5000"}, r"--node-rank 2: must be in"),
    ({"tp_size": 2, "dist_init_addr": "nowhere"}, "expected HOST:PORT"),
    ({"dp_size": 2, "nnodes": 2, "tp_size": 2, "dist_init_addr": "127.0.0.1:5000"}, "data parallelism runs on one"),
])
def test_bad_parallel_sizes_are_refused(flags, message):
    from toolkit.runtime.server_args import ServerArgs

    with pytest.raises(ValueError, match=message):
        ServerArgs(**flags)


def test_tiny_model_with_odd_tp_size_is_refused(gqa_model):
    folder, _ = gqa_model
    with pytest.raises(ModelLoadError, match=r"--tp-size 3: .* 4 attention heads and 2 KV heads.*work: 1, 2, 4"):
        tiny_engine(folder, tp_size=3)


def test_a_killed_rank_is_named_and_the_engine_fails_fast(gqa_model, prompts):
    folder, _ = gqa_model
    engine = tiny_engine(folder, tp_size=2)
    try:
        assert _generate(engine, prompts[:2])
        (pid,) = engine.followers.pids
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(DistributedError, match=r"TP rank 0: lost TP rank 1 of the TP group at 127\.0\.0\.1:\d+"):
            _generate(engine, prompts[:2])
        assert time.monotonic() - started < scaled(30)
        with pytest.raises(DistributedError):  # the engine stays failed, it never waits on the lost rank
            _generate(engine, prompts[:1])
    finally:
        started = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - started < scaled(30)
    assert not engine.followers.any_alive()


def test_a_rank_that_never_joins_is_named_within_the_timeout():
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DistributedError, match=rf"TP rank 1 did not join the TP group at {address} within 2 s"):
        TPGroup(RankInfo(0, 2, init_addr=address, join_timeout_s=2), torch.device("cpu"), op_timeout_s=10)
    assert 1.5 < time.monotonic() - started < scaled(30)


def test_a_missing_rank_zero_is_named_within_the_timeout():
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DistributedError, match=rf"TP rank 1 could not reach TP rank 0 at {address} within 2 s"):
        TPGroup(RankInfo(1, 2, init_addr=address, join_timeout_s=2), torch.device("cpu"), op_timeout_s=10)
    assert 1.5 < time.monotonic() - started < scaled(30)
