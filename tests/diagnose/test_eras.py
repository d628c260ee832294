"""For every era in docs/log-formats.md: a generated log whose parsed events equal the values written into it."""
from __future__ import annotations

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.read.lines import parse_lines
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import ERAS, Log, Rank, Startup


def _era_log(era: str) -> Log:
    log = Log(era, Rank(tp=0, tp_size=2))
    log.start(Startup(), model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=2, mem_fraction_static=0.85)
    log.add(lf.prefill(era, new_seq=4, new_token=8192, cached=512, running=229, queue=313, usage=0.41,
                       token=272933, hit_rate=0.25, pending=777, throughput=1234.5), dt=1)
    log.add(lf.decode(era, running=233, token=370959, usage=0.82, throughput=4594.01, queue=317, graph=True), dt=1)
    log.add(lf.retract(era, k=3, old=0.9998, new=1.0), dt=1)
    log.add(lf.access(), dt=1, scheduler=False)
    if lf._v(era) >= (0, 3, 6):
        log.add(lf.watchdog(era, 300), dt=1)
    for line in lf.oom_block("decode", 64, 10, 5):
        log.lines.append((lf.prefix(era, log.t + 1, log.rank) if line.startswith("Scheduler") else "") + line)
    return log


def _by_kind(lines: list[str]) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in parse_lines(lines):
        out.setdefault(e.kind, []).append(e)
    return out


@pytest.mark.parametrize("era", ERAS)
def test_every_era_parses_to_the_values_written(era: str) -> None:
    v = lf._v(era)
    events = _by_kind(_era_log(era).lines)
    dec = events["decode"][0].fields
    assert (dec["running_req"], dec["token"], dec["token_usage"], dec["queue_req"]) == (233, 370959, 0.82, 317)
    if v >= (0, 2, 5):
        assert dec["gen_throughput"] == 4594.01
    if v >= (0, 4, 9):
        assert dec["cuda_graph"] is True
    pre = events["prefill"][0].fields
    assert (pre["new_seq"], pre["new_token"], pre["cached_token"], pre["running_req"], pre["queue_req"]) == (
        4, 8192, 512, 229, 313)
    if v < (0, 4, 9):
        assert pre["cache_hit_rate"] == pytest.approx(0.25)
    if v >= (0, 3, 6):
        assert pre["token_usage"] == 0.41
    if v >= (0, 5, 23):
        assert (pre["pending_token"], pre["input_throughput"], pre["token"]) == (777, 1234.5, 272933)
    ret = events["retract"][0].fields
    assert (ret["retracted_reqs"], ret["new_token_ratio_old"], ret["new_token_ratio"]) == (3, 0.9998, 1.0)
    acc = events["access"][0].fields
    assert (acc["method"], acc["path"], acc["status"]) == ("POST", "/v1/chat/completions", 200)
    oom = events["oom"][0].fields
    assert (oom["phase"], oom["requested"], oom["available_tokens"], oom["available_size"], oom["evictable_size"]) == (
        "decode", 64, 15, 10, 5)
    assert "exception" in events
    if v >= (0, 3, 6):
        assert events["watchdog"][0].fields["watchdog_timeout"] == 300


@pytest.mark.parametrize("era", ERAS)
def test_every_era_reads_time_rank_and_line_numbers(era: str) -> None:
    log = _era_log(era)
    events = _by_kind(log.lines)
    dec = events["decode"][0]
    assert log.lines[dec.line - 1].endswith(lf.decode(era, running=233, token=370959, usage=0.82,
                                                     throughput=4594.01, queue=317))
    v = lf._v(era)
    if v < (0, 2, 15):
        assert dec.time is None
    elif v < (0, 3, 6):
        assert dec.time == (lf.T0 + 2) % 86400  # HH:MM:SS only: seconds within day 0
    else:
        assert dec.time == lf.T0 + 2
    expected_rank = {"0.1.14": "", "0.2.5": "GPU0"}.get(era, "TP0")
    assert dec.rank == expected_rank


@pytest.mark.parametrize("era", ERAS)
def test_every_era_reads_the_startup_config(era: str) -> None:
    d = analyze(lines=_era_log(era).lines)
    cfg, v = d.config, lf._v(era)
    assert cfg.max_total_num_tokens == 665690
    assert cfg.max_prefill_tokens == 16384
    assert cfg.context_len == 65536
    assert cfg.args["tp_size"] == 2 and cfg.mem_fraction_static == 0.85
    if v >= (0, 2, 5):
        assert cfg.max_running_requests == 4096
        assert cfg.gpu_mem_gb == 78.5
        assert cfg.weight_mem_gb == pytest.approx(15.1)
    if v >= (0, 4, 3):
        assert cfg.chunked_prefill_size == 8192
        assert cfg.kv_mem_gb == pytest.approx(40.63, abs=0.02)
    if v >= (0, 4, 9):
        assert cfg.available_mem_gb == 6.5 and cfg.device == "gpu"
    assert d.stats.unread == 0


@pytest.mark.parametrize("era", ERAS)
def test_era_is_recognised_from_its_forms(era: str) -> None:
    era_seen = analyze(lines=_era_log(era).lines).config.era
    assert era_seen is not None
    assert lf._v(era_seen) <= lf._v(era)


OWN_RUNTIME = """\
[2025-11-11 04:06:20] server_args=ServerArgs(model_path='SmolLM2-135M-Instruct', tp_size=1, mem_fraction_static=0.88, schedule_policy='fcfs')
[2025-11-11 04:06:21] Load weight begin. avail mem=78.50 GB
[2025-11-11 04:06:22] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.40 GB, mem usage=15.10 GB.
[2025-11-11 04:06:22] KV Cache is allocated. #tokens: 665690, K size: 40.63 GB, V size: 40.63 GB
[2025-11-11 04:06:23] Capture cuda graph begin. This can take up to several minutes. avail mem=20.10 GB
[2025-11-11 04:06:35] Capture cuda graph end. Time elapsed: 12.34 s. mem usage=0.81 GB. avail mem=13.50 GB.
[2025-11-11 04:06:35] max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=65536, available_gpu_mem=13.50 GB
[2025-11-11 04:06:40] Prefill batch. #new-seq: 4, #new-token: 8192, #cached-token: 512, token usage: 0.41, #running-req: 229, #queue-req: 313
[2025-11-11 04:06:41] Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, gen throughput (token/s): 4594.01, #queue-req: 317
[2025-11-11 04:06:42] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000
"""


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_own_runtime_lines_parse_completely(device: str) -> None:
    text = OWN_RUNTIME if device == "gpu" else OWN_RUNTIME.replace("available_gpu_mem", "available_cpu_mem")
    d = analyze(lines=text.splitlines())
    assert d.stats.unread == 0 and d.stats.other == 0
    assert sum(d.stats.kinds.values()) == len(text.splitlines())
    cfg = d.config
    assert (cfg.max_total_num_tokens, cfg.chunked_prefill_size, cfg.max_running_requests, cfg.context_len) == (
        665690, 8192, 4096, 65536)
    assert cfg.available_mem_gb == 13.5
    assert cfg.device == device
    assert cfg.weight_mem_gb == 15.1 and cfg.graph_mem_gb == 0.81 and cfg.gpu_mem_gb == 78.5
    assert cfg.kv_mem_gb == pytest.approx(81.26)
    dec = d.timeline.series("decode")
    assert dec["token"][0] == 370959 and dec["usage"][0] == pytest.approx(370959 / 665690)
