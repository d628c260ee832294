"""A log written by our own engine (`log_file=`) parses completely and its numbers match the engine's counters.

The in-process engine runs a tiny model with random (dummy-format) weights, one decode line per step, and a pool
small enough, admitted optimistically enough, to force a retraction; a second pass over some of the prompts hits
the radix cache."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolkit.diagnose import Diagnosis, analyze
from toolkit.diagnose.read.lines import parse_path
from tests.runtime.engine_fixtures import random_prompts, tiny_engine
from tests.runtime.tiny_models import TINY_CONFIGS
from toolkit.cli import app

# NOTE: one-token pages, so the 200-token pool holds exactly 200 and the optimistic admission retracts.
ENGINE_ARGS = dict(load_format="dummy", random_seed=0, decode_log_interval=1, max_total_tokens=200, page_size=1,
                   schedule_conservativeness=0.05, chunked_prefill_size=64, log_level="info")


@dataclass(frozen=True)
class EngineRun:
    log: Path
    stats: object
    scheduler: object
    runner: object
    args: object


def _close_file_handler(path: Path) -> None:
    root = logging.getLogger("runtime")
    for handler in [h for h in root.handlers if getattr(h, "baseFilename", None) == str(path)]:
        root.removeHandler(handler)
        handler.close()


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory) -> EngineRun:
    folder = tmp_path_factory.mktemp("tiny-llama-diagnose")
    (folder / "config.json").write_text(json.dumps(TINY_CONFIGS["llama-gqa-llama3rope"]))
    log = folder / "server.log"
    engine = tiny_engine(folder, log_file=str(log), **ENGINE_ARGS)
    try:
        prompts = random_prompts(8, vocab=320, seed=11)
        engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "ignore_eos": True})
        engine.generate(input_ids=prompts[:4], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    finally:
        _close_file_handler(log)
    return EngineRun(log, engine.scheduler.stats, engine.scheduler, engine.runner, engine.server_args)


@pytest.fixture(scope="module")
def diagnosis(engine_run: EngineRun) -> Diagnosis:
    return analyze([engine_run.log])


def test_every_line_of_our_log_is_read(engine_run: EngineRun, diagnosis: Diagnosis) -> None:
    lines = engine_run.log.read_text().splitlines()
    assert diagnosis.stats.lines == len(lines) and diagnosis.stats.unread == 0
    # the lines SGLang does not print (the CPU and packing lines: on a CPU)
    ours_only = ("Attention backend:", "] CPU: ", "oneDNN-packed linear weights")
    others = [line for line in lines if not any(mark in line for mark in ours_only)]
    assert diagnosis.stats.other == len(lines) - len(others)
    events = list(parse_path(engine_run.log))
    assert all(e.time is not None and e.rank == "" for e in events)


def test_event_counts_equal_the_schedulers_counters(engine_run: EngineRun, diagnosis: Diagnosis) -> None:
    kinds, stats = diagnosis.stats.kinds, engine_run.stats
    assert kinds["prefill"] == stats.total_prefill_batches
    assert kinds["decode"] == stats.total_decode_steps
    assert kinds["retract"] >= 1 and stats.total_retracted_reqs >= 1
    startup = {k: kinds[k] for k in ("server_args", "load_begin", "load_end", "kv_alloc", "pool_end", "pool")}
    assert startup == dict.fromkeys(startup, 1)
    assert not {"oom", "exception", "leak", "watchdog", "graph_failed", "not_enough_memory"} & set(kinds)


def test_field_sums_equal_the_schedulers_totals(engine_run: EngineRun, diagnosis: Diagnosis) -> None:
    tl, stats = diagnosis.timeline, engine_run.stats
    prefill = tl.series("prefill")
    assert prefill["new_token"].sum() == stats.total_prefill_tokens
    assert prefill["cached_token"].sum() == stats.total_cached_tokens > 0
    retracted = sum(e.fields["retracted_reqs"] for e in parse_path(engine_run.log) if e.kind == "retract")
    assert retracted == stats.total_retracted_reqs
    assert tl.decode_log_interval == 1


def test_token_usage_is_the_token_count_over_the_pool(engine_run: EngineRun, diagnosis: Diagnosis) -> None:
    decode = diagnosis.timeline.series("decode")
    pool = engine_run.scheduler.max_total_num_tokens
    assert (abs(decode["token"] / pool - decode["token_usage"]) <= 0.005 + 1e-9).all()
    assert decode["token"].max() <= pool


def test_config_read_from_the_startup_line_equals_the_engines(engine_run: EngineRun, diagnosis: Diagnosis) -> None:
    cfg, scheduler = diagnosis.config, engine_run.scheduler
    assert cfg.max_total_num_tokens == scheduler.max_total_num_tokens == ENGINE_ARGS["max_total_tokens"]
    assert cfg.chunked_prefill_size == scheduler.chunked_prefill_size == ENGINE_ARGS["chunked_prefill_size"]
    assert cfg.max_running_requests == scheduler.max_running_requests
    assert cfg.context_len == scheduler.context_len
    assert cfg.max_prefill_tokens == engine_run.args.max_prefill_tokens
    assert cfg.device == "cpu" and cfg.available_mem_gb == round(engine_run.runner.avail_after_pool, 2)
    assert cfg.schedule_conservativeness == ENGINE_ARGS["schedule_conservativeness"]
    assert cfg.model_class == "LlamaForCausalLM" and cfg.dtype == "torch.float32"


def test_toolkit_diagnose_on_our_log_exits_cleanly(engine_run: EngineRun) -> None:
    result = CliRunner().invoke(app, ["diagnose", str(engine_run.log), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["lines"]["unread"] == 0
    ids = [f["id"] for f in doc["findings"]]
    assert not [i for i in ids if i.startswith(("rule-error", "crash", "oom"))], ids
