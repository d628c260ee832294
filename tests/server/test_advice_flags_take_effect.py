"""What `toolkit diagnose` advises for parallelism and fp8 is a command our own `toolkit serve` runs: the corrected
launch command parses with serve's flags, and the flags take effect (DP replicas planned, an fp8 KV pool, fp8
weights)."""
from __future__ import annotations

import shlex

import pytest
import torch

from tests.diagnose.logfactory import Rank, Startup
from tests.diagnose.test_rules import N, base, mask
from tests.runtime.engine_fixtures import tiny_engine
from tests.runtime.tiny_models import make_tiny_model
from toolkit.diagnose import analyze
from toolkit.runtime.distributed.topology import local_ranks
from toolkit.runtime.models.fp8 import Fp8Linear
from toolkit.runtime.server_args import parse_server_args


def _serve_args(command: str, model_path: str):
    """The advised SGLang command's flags, as `toolkit serve` parses them (our model instead of theirs)."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], command
    flags = argv[3:]
    flags[flags.index("--model-path") + 1] = model_path
    return parse_server_args([*flags, "--device", "cpu"])


def test_dp_over_tp_advice_runs_as_replicas_in_serve():
    log = base(Startup(weights=15.1), rank=Rank(tp=0, tp_size=2), tp_size=2).decode_series(5)
    diagnosis = analyze(lines=log.lines)
    assert [f.flag for f in diagnosis.findings if f.id == "parallelism.dp_over_tp"] == ["--dp-size"]
    args = _serve_args(diagnosis.command, "m")
    assert (args.dp_size, args.tp_size) == (2, 1)
    assert [(r.dp_rank, r.tp_rank) for r in local_ranks(args)] == [(0, 0), (1, 0)]


def test_fp8_advice_gives_an_fp8_kv_pool_and_fp8_weights(tmp_path):
    log = base(Startup(weights=40.0)).decode_series(N, queue=[10 if m else 0 for m in mask(15)], usage=0.95)
    diagnosis = analyze(lines=log.lines)
    assert {f.flag for f in diagnosis.findings if f.id.startswith("fp8.")} == {"--kv-cache-dtype", "--quantization"}
    make_tiny_model("llama-gqa-llama3rope", tmp_path, seed=1)
    args = _serve_args(diagnosis.command, str(tmp_path))
    assert (args.kv_cache_dtype, args.quantization) == ("fp8_e5m2", "fp8")
    engine = tiny_engine(tmp_path, kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization)
    try:
        assert engine.runner.kv_pool.k_buffer[0].dtype == torch.float8_e5m2
        assert isinstance(engine.runner.model.model.layers[0].mlp.down_proj, Fp8Linear)
        result = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
        assert len(result["output_ids"]) == 4
    finally:
        engine.shutdown()


@pytest.mark.parametrize("flag, value", [("--tp-size", "2"), ("--dp-size", "2"), ("--kv-cache-dtype", "fp8_e4m3"),
                                         ("--quantization", "fp8")])
def test_no_parallelism_or_fp8_flag_is_refused_as_unimplemented(flag, value):
    args = parse_server_args([flag, value])
    assert str(getattr(args, flag[2:].replace("-", "_"))) == value
