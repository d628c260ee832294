"""Every rule runs on every well-formed log, however short: no decode lines, no prefill lines, start-up lines
only, a single line. A rule that cannot judge stays silent; it never reports "could not run"."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from toolkit.diagnose import analyze
from toolkit.diagnose.report_json import to_dict
from toolkit.diagnose.report_terminal import render
from toolkit.diagnose.rules import RULES, Context
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup

ARGS = dict(model_path="m", tp_size=1, mem_fraction_static=0.85, schedule_policy="fcfs")


def _prefills(log: Log, n: int, era: str = "0.4.9") -> Log:
    for i in range(n):
        log.add(lf.prefill(era, new_seq=2, new_token=300 + i, cached=100, running=i, queue=5, usage=0.3,
                           token=1000, hit_rate=0.2), dt=1)
    return log


def _startup_only() -> list[str]:
    return Log().start(Startup(device="cpu"), **ARGS).lines


def _prefill_only() -> list[str]:
    return _prefills(Log().start(Startup(), **ARGS), 20).lines


def _decode_only() -> list[str]:
    return Log().decode_series(20, running=50, queue=3, usage=0.5).lines


def _decode_without_startup_or_args() -> list[str]:
    return Log().decode_series(20, running=[40, 50, 60], queue=[0, 9], usage=0.95, throughput=[10.0, 5000.0]).lines


def _one_prefill() -> list[str]:
    return _prefills(Log(), 1).lines


def _one_decode() -> list[str]:
    return Log().decode_series(1).lines


def _retract_only() -> list[str]:
    return Log().add(lf.retract("0.4.9", k=2, old=0.5, new=1.0)).add(lf.retract("0.4.9", k=1, old=0.5, new=1.0),
                                                                      dt=1).lines


def _access_only() -> list[str]:
    return [lf.prefix("0.4.9", lf.T0 + i, scheduler=False) + lf.access() for i in range(5)]


def _oldest_era_prefill_only() -> list[str]:
    return _prefills(Log("0.1.14").start(Startup()), 12, "0.1.14").lines


SHORT_LOGS = {
    "empty": lambda: [],
    "server_args only": lambda: [lf.server_args(**ARGS)],
    "startup lines only": _startup_only,
    "prefill lines, no decode lines": _prefill_only,
    "decode lines, no prefill lines": _decode_only,
    "decode lines without startup or server_args": _decode_without_startup_or_args,
    "a single prefill line": _one_prefill,
    "a single decode line": _one_decode,
    "retractions only": _retract_only,
    "access lines only": _access_only,
    "0.1.14 prefill lines without times": _oldest_era_prefill_only,
}


@pytest.mark.parametrize("name", SHORT_LOGS)
def test_every_rule_runs_on_a_short_log(name: str) -> None:
    d = analyze(lines=SHORT_LOGS[name]())
    ctx = Context(d.timeline)
    for rule in RULES.values():
        rule(ctx)  # raises here, with its traceback, if a rule cannot run
    assert not [f.id for f in d.findings if f.id.startswith("rule-error")]


@pytest.mark.parametrize("name", SHORT_LOGS)
def test_short_log_reports_render(name: str) -> None:
    d = analyze(lines=SHORT_LOGS[name]())
    doc = to_dict(d)
    assert doc["lines"]["unread"] == 0
    render(d, Console(file=io.StringIO(), width=100))


def test_prefill_only_log_still_reads_the_config_and_counts() -> None:
    d = analyze(lines=_prefill_only())
    assert d.stats.kinds["prefill"] == 20 and d.config.max_total_num_tokens == Startup().max_total
    assert len(d.timeline.series("prefill")) == 20 and d.timeline.frames == {}  # no rank frame without decode lines
    assert len(d.timeline.series("decode")) == 0 and d.status == "insufficient"
