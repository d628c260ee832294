"""Request lifecycle in the scheduler: aborts at every stage free everything, and the log lines agree with
the scheduler's own counters, with overlap scheduling on and off."""
from __future__ import annotations

import re

import pytest

from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.io_struct import GenerateInput
from tests.runtime.engine_fixtures import LogCapture, random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model

# docs/log-formats.md §2-§4, §6: the 0.4.9-era templates our scheduler writes, as regexes
DECODE_RE = re.compile(
    r"Decode batch\. #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), cuda graph: (True|False), "
    r"gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+), #grammar-queue-req: (\d+)$"
)
PREFILL_RE = re.compile(
    r"Prefill batch\. #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: ([\d.]+), "
    r"#running-req: (\d+), #queue-req: (\d+)$"
)
RETRACT_RE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), "
                        r"#new_token_ratio: ([\d.]+) -> ([\d.]+)$")
STARTUP_RE = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
                        r"max_running_requests=(\d+), context_len=(\d+), available_cpu_mem=([\d.]+) GB$")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-lifecycle")
    make_tiny_model("qwen3-qknorm", path, seed=3)
    return path


def _submit(scheduler, rid: str, prompt: list[int], max_new: int) -> None:
    scheduler.add_request(GenerateInput(rid, prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True)))


def _drain(scheduler, limit: int = 2000) -> list:
    outputs = []
    for _ in range(limit):
        outputs += scheduler.step()
        scheduler.check_statuses()
        if not scheduler.has_work:
            scheduler.step()  # an idle step runs the integrity check
            return outputs
    raise AssertionError("scheduler did not drain")


def test_abort_waiting_request_never_runs(folder, overlap):
    scheduler = tiny_engine(folder, disable_overlap_schedule=not overlap).scheduler
    _submit(scheduler, "a", list(range(3, 40)), 8)
    scheduler.abort_request("a")
    outputs = _drain(scheduler)
    assert [(o.rid, o.token_id, o.finished_reason.kind) for o in outputs] == [("a", None, "abort")]
    assert scheduler.check_memory()


def test_abort_mid_chunked_prefill_frees_everything(folder, overlap):
    scheduler = tiny_engine(folder, chunked_prefill_size=16, disable_overlap_schedule=not overlap).scheduler
    _submit(scheduler, "long", list(range(3, 100)), 8)
    scheduler.step()
    assert scheduler.chunked_req is not None and scheduler.runner.allocator.available_size() < 4096
    scheduler.abort_request("long")
    outputs = _drain(scheduler)
    assert outputs[-1].finished_reason.kind == "abort" and all(o.token_id is None for o in outputs)
    assert scheduler.check_memory()


@pytest.mark.parametrize("page_size", [1, 16])
def test_abort_mid_decode_frees_everything_and_others_finish(folder, page_size, overlap):
    scheduler = tiny_engine(folder, page_size=page_size, disable_overlap_schedule=not overlap).scheduler
    for i, prompt in enumerate(random_prompts(4, 320, seed=5)):
        _submit(scheduler, f"r{i}", prompt, 30)
    for _ in range(6):
        scheduler.step()
    assert len(scheduler.running) == 4
    scheduler.abort_request("r2")
    outputs = _drain(scheduler)
    finished = {o.rid: o.finished_reason.kind for o in outputs if o.finished_reason}
    assert finished == {"r0": "length", "r1": "length", "r2": "abort", "r3": "length"}
    assert scheduler.check_memory()


def test_log_lines_parse_and_agree_with_the_counters(folder, overlap):
    engine = tiny_engine(folder, decode_log_interval=1, chunked_prefill_size=32, max_total_tokens=900,
                         schedule_conservativeness=0.05, disable_overlap_schedule=not overlap)
    prompts = random_prompts(12, 320, seed=9)
    with LogCapture() as log:
        results = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 30, "ignore_eos": True})
    decode = [DECODE_RE.match(line) for line in log.lines if line.startswith("Decode batch.")]
    prefill = [PREFILL_RE.match(line) for line in log.lines if line.startswith("Prefill batch.")]
    retract = [RETRACT_RE.match(line) for line in log.lines if line.startswith("KV cache pool is full.")]
    assert decode and prefill and all(decode) and all(prefill)
    assert retract and all(retract), "the 900-token pool never forced a retraction, so its line went unchecked"
    stats = engine.scheduler.stats
    # every decode step logs (interval 1); its #running-req is the requests it ran, which without overlap is
    # the tokens it generated (with overlap, a request that finished in the step before still runs once more)
    batch_sizes = sum(int(m.group(1)) for m in decode)
    decode_tokens = stats.total_generated_tokens
    assert len(decode) == stats.total_decode_steps
    assert batch_sizes == decode_tokens if not overlap else batch_sizes >= decode_tokens
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    retracted = sum(int(m.group(1)) for m in retract)
    finished_prefills = completion - decode_tokens  # each first token comes from a prefill batch
    assert 12 <= finished_prefills <= 12 + retracted
    assert stats.total_retracted_reqs == retracted
    assert sum(int(m.group(2)) for m in prefill) == stats.total_prefill_tokens
    pool = engine.scheduler.max_total_num_tokens
    for m in decode:
        # the line rounds to 2 decimals: a usage half-way between two (784 / 896 = 0.875) may print either way
        assert abs(float(m.group(3)) - int(m.group(2)) / pool) <= 0.005 + 1e-9 and m.group(4) == "False"
    assert engine.check_memory()


def test_startup_line_reports_the_resolved_limits(folder):
    with LogCapture() as log:
        tiny_engine(folder, max_total_tokens=1000, max_running_requests=7, chunked_prefill_size=48)
    (line,) = [line for line in log.lines if line.startswith("max_total_num_tokens=")]
    match = STARTUP_RE.match(line)
    # a CPU's default 16-token pages: the pool is 1000 tokens rounded down to whole pages
    assert match and match.groups()[:5] == ("992", "48", "16384", "7", "512")
    (args_line,) = [line for line in log.lines if line.startswith("server_args=ServerArgs(")]
    # NOTE: the autos resolved before the arguments froze: the line shows what runs
    assert "attention_backend='torch_native'" in args_line and "page_size=16" in args_line
    assert re.search(r" dtype='(float32|bfloat16)'", args_line)
    assert any(line.startswith("Load weight begin. avail mem=") for line in log.lines)
    assert any(re.match(r"KV Cache is allocated\. #tokens: 992, K size: [\d.]+ GB, V size: [\d.]+ GB$", line)
               for line in log.lines)


def test_idle_integrity_check_logs_a_leak(folder):
    engine = tiny_engine(folder)
    engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 3})
    assert engine.check_memory()
    engine.runner.allocator.alloc(5)  # slots taken behind the scheduler's back
    with LogCapture() as log:
        assert not engine.check_memory()
    assert any("token_to_kv_pool_allocator memory leak detected!" in line for line in log.lines)


def test_the_step_that_empties_the_scheduler_resets_the_ratio_and_checks_memory(folder, overlap):
    """SGLang resets the new-token ratio on every idle turn: the server's loop then blocks waiting for messages,
    so the reset must not wait for an empty step that a new request would pre-empt."""
    scheduler = tiny_engine(folder, disable_overlap_schedule=not overlap).scheduler
    for i, prompt in enumerate(random_prompts(3, 320, seed=7)):
        _submit(scheduler, f"r{i}", prompt, 12)
    decayed = False
    for _ in range(200):
        scheduler.step()
        decayed |= scheduler.ratio.value < scheduler.ratio.init
        if not scheduler.has_work:
            break
    assert decayed, "decode steps decay the ratio"
    assert scheduler.ratio.value == scheduler.ratio.init
    assert scheduler._checked_since_idle, "the idle integrity check ran in that same step"
