"""Decode CUDA graphs on a CUDA GPU (skipped cleanly without one): greedy output identical with graphs on and off,
the forward's `used_cuda_graph` and the decode lines tell the truth per step, the capture lines and the startup
line agree, the KV pool follows --mem-fraction-static, torch.compile keeps the output."""
from __future__ import annotations

import gc
import json
import re

import pytest
import torch

from toolkit.runtime.cuda_graph_runner import capture_batch_sizes
from toolkit.runtime.forward_batch import ForwardMode
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.attention.fake_flashinfer import real_flashinfer_missing
from tests.runtime.driver import KVDriver
from tests.runtime.engine_fixtures import FORCED_RETRACTION, LogCapture, random_prompts, retraction_lines, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CAPTURE_BEGIN_RE = re.compile(r"Capture cuda graph begin\. This can take up to several minutes\. "
                              r"avail mem=(\d+\.\d\d) GB$")
CAPTURE_END_RE = re.compile(r"Capture cuda graph end\. Time elapsed: (\d+\.\d\d) s\. mem usage=(-?\d+\.\d\d) GB\. "
                            r"avail mem=(\d+\.\d\d) GB\.$")
STARTUP_RE = re.compile(r"max_total_num_tokens=\d+, .*, available_gpu_mem=(\d+\.\d\d) GB$")
DECODE_RE = re.compile(r"Decode batch\. #running-req: (\d+), .*cuda graph: (True|False),")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-graphs")
    make_tiny_model("llama-gqa-llama3rope", path, seed=7)
    return path


def _engine(folder, **kwargs):
    return tiny_engine(folder, device="cuda", attention_backend="triton", **kwargs)


def _shutdown(engine) -> None:
    """Give the engine's GPU memory back before the next one plans its pool."""
    engine.shutdown()
    gc.collect()
    torch.cuda.empty_cache()


def _greedy(engine, prompts, max_new):
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in max_new]
    return [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]


def _spy_flags(engine) -> list[tuple[bool, int, bool]]:
    """(decode?, batch size, used a graph?) of every forward the scheduler runs."""
    seen, runner = [], engine.runner
    forward = runner.forward

    def spy(batch):
        output = forward(batch)
        seen.append((batch.mode is ForwardMode.DECODE, batch.batch_size, output.used_cuda_graph))
        return output

    runner.forward = spy
    return seen


def test_graph_and_eager_greedy_outputs_are_identical(folder):
    prompts = random_prompts(16, vocab=320, seed=11)
    max_new = [6 + (i * 5) % 19 for i in range(16)]
    graphs = _engine(folder, cuda_graph_max_bs=8)
    assert graphs.runner.graph_runner.batch_sizes == [1, 2, 4, 8]
    with_graphs = _greedy(graphs, prompts, max_new)
    assert graphs.check_memory()
    _shutdown(graphs)
    eager = _engine(folder, disable_cuda_graph=True)
    assert eager.runner.graph_runner is None
    assert with_graphs == _greedy(eager, prompts, max_new)


@pytest.mark.parametrize("pressure", ["roomy", "forced-retraction"])
def test_overlap_on_and_off_give_identical_greedy_output(folder, pressure):
    """CUDA's default overlaps the host's work on step N with the forward of step N+1 (sampled tokens stay on the
    GPU between them); the output equals the serial schedule's, also when a small pool forces retractions."""
    prompts = random_prompts(16, vocab=320, seed=11)
    retract = pressure == "forced-retraction"
    max_new = [40] * 16 if retract else [6 + (i * 5) % 19 for i in range(16)]
    settings = {"cuda_graph_max_bs": 8, **(FORCED_RETRACTION if retract else {})}
    outputs = []
    for disable_overlap in (False, True):
        engine = _engine(folder, disable_overlap_schedule=disable_overlap, **settings)
        assert engine.server_args.disable_overlap_schedule is disable_overlap
        with LogCapture() as log:
            outputs.append(_greedy(engine, prompts, max_new))
        assert engine.check_memory(), "KV memory leaked"
        _shutdown(engine)
        assert bool(retraction_lines(log.lines)) is retract
    assert outputs[0] == outputs[1]


def test_flag_and_decode_lines_tell_whether_each_step_replayed_a_graph(folder):
    engine = _engine(folder, cuda_graph_max_bs=4, decode_log_interval=1)
    seen = _spy_flags(engine)
    prompts = random_prompts(6, vocab=320, seed=3)
    with LogCapture() as log:
        _greedy(engine, prompts, [4, 6, 8, 10, 12, 14])
    assert all(used == (decode and bs <= 4) for decode, bs, used in seen)
    decode_sizes = {bs for decode, bs, _ in seen if decode}
    assert {3, 6} <= decode_sizes, "both a padded (3 -> 4) and an eager (6 > 4) decode batch ran"
    lines = [m for m in map(DECODE_RE.search, log.lines) if m]
    assert lines
    # NOTE: the decode line reports the forward's used_cuda_graph of its step.
    assert all((m.group(2) == "True") == (int(m.group(1)) <= 4) for m in lines)


def test_capture_lines_and_startup_line_agree(folder):
    with LogCapture() as log:
        engine = _engine(folder)
    # the request pool (max_running_requests=64, +1 row) caps the default list and is captured itself
    expected = capture_batch_sizes(None, engine.server_args.cuda_graph_max_bs, 65)
    assert engine.runner.graph_runner.batch_sizes == expected and expected[-1] == 65
    begin = next(m for m in map(CAPTURE_BEGIN_RE.search, log.lines) if m)
    end = next(m for m in map(CAPTURE_END_RE.search, log.lines) if m)
    startup = next(m for m in map(STARTUP_RE.search, log.lines) if m)
    order = [next(i for i, line in enumerate(log.lines) if key in line) for key in (
        "Load weight end", "KV Cache is allocated", "Capture cuda graph begin", "Capture cuda graph end",
        "max_total_num_tokens=")]
    assert order == sorted(order)
    assert float(begin.group(1)) - float(end.group(3)) == pytest.approx(float(end.group(2)), abs=0.016)
    assert startup.group(1) == end.group(3)


def test_torch_native_on_cuda_runs_without_graphs_and_says_so(folder):
    with LogCapture() as log:
        engine = tiny_engine(folder, device="cuda", attention_backend="torch_native")
    assert engine.runner.graph_runner is None
    assert "Cuda graph is disabled because --attention-backend torch_native does not support it." in log.lines


def test_pool_grows_and_shrinks_with_mem_fraction_static(folder):
    """Measured, not recomputed: the pool's tensors hold the planned tokens, and what the GPU has free after the
    weights and the pool is the (1 - fraction) share of what it had before the weights (SGLang's rule)."""
    gc.collect()
    torch.cuda.empty_cache()
    tokens, expected_gain = {}, 0.0
    for fraction in (0.5, 0.6):
        args = ServerArgs(model_path=str(folder), dtype="float32", device="cuda", mem_fraction_static=fraction,
                          disable_cuda_graph=True, max_running_requests=8)
        runner = ModelRunner(args)
        tokens[fraction] = runner.max_total_num_tokens
        pool = runner.kv_pool.k_buffer + runner.kv_pool.v_buffer
        assert sum(t.numel() * t.element_size() for t in pool) == (tokens[fraction] + 1) * runner.kv_bytes_per_token
        free_after = torch.cuda.mem_get_info(runner.device)[0] / (1 << 30)
        # NOTE: besides the pool, the allocator's free list (8 bytes a token) and the request table are allocated
        reserve = runner.avail_before_weights * (1 - fraction)
        assert free_after == pytest.approx(reserve, abs=0.03 * runner.avail_before_weights)
        expected_gain = 0.1 * runner.avail_before_weights * (1 << 30) / runner.kv_bytes_per_token
        del runner, pool
        gc.collect()
        torch.cuda.empty_cache()
    assert tokens[0.6] - tokens[0.5] == pytest.approx(expected_gain, rel=0.05)


@pytest.mark.skipif(real_flashinfer_missing() is not None, reason=str(real_flashinfer_missing()))
def test_flashinfer_graph_logits_match_eager():
    overrides = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 512}
    args = ServerArgs(model_path="llama-3.1-8b", load_format="dummy", json_model_override_args=json.dumps(overrides),
                      context_length=512, dtype="bfloat16", device="cuda", attention_backend="flashinfer",
                      max_total_tokens=4096, max_running_requests=8, cuda_graph_bs=[1, 4])
    runner = ModelRunner(args)
    driver = KVDriver(runner)
    seqs = [driver.new_sequence() for _ in range(3)]
    driver.extend(seqs, [[5] * 40, [6] * 7, [7] * 100])
    graph_logits = driver.decode(seqs, [8, 9, 10]).clone()
    assert driver.used_cuda_graph
    graphs, runner.graph_runner = runner.graph_runner, None
    for seq in seqs:
        seq.tokens.pop()  # decode the same tokens again, eagerly, into fresh slots
    eager_logits = driver.decode(seqs, [8, 9, 10])
    runner.graph_runner = graphs
    scale = eager_logits.abs().max().item()
    assert (graph_logits - eager_logits).abs().max().item() <= 0.05 * scale


@pytest.mark.slow
def test_torch_compile_keeps_greedy_output(folder):
    prompts = random_prompts(4, vocab=320, seed=5)
    max_new = [5, 7, 9, 11]
    compiled = _engine(folder, enable_torch_compile=True, torch_compile_max_bs=2, cuda_graph_bs=[1, 2, 4])
    assert compiled.runner.graph_runner.compile_batch_sizes == {1, 2}
    with_compile = _greedy(compiled, prompts, max_new)
    _shutdown(compiled)
    assert with_compile == _greedy(_engine(folder, disable_cuda_graph=True), prompts, max_new)
