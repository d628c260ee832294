"""Shed and timed-out requests (docs/log-formats.md §6.4): the lines `toolkit serve` writes are read by both
parsers alike, counted once, and judged by `rules/shedding.py`: shedding too much asks for capacity, clients giving
up on an uncapped queue ask for `--max-queued-requests`."""
from __future__ import annotations

from pathlib import Path

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup, VllmLog
from tests.diagnose.test_fastpath import _same
from toolkit.diagnose import analyze
from toolkit.diagnose.vocabulary import Change
from toolkit.diagnose.read.lines import parse_lines
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.rules.shedding import longest_run, shed_of

ROOT = Path(__file__).resolve().parents[2]
ARGS = dict(model_path="m", max_running_requests=128)


def _ids(d) -> dict[str, object]:
    return {f.id: f for f in d.findings}


def _serving(*, shed_every: int, queue_full: int = 8, waiting_timeout: int = 0, n: int = 30, usage: float = 0.92,
             running: int = 100, args: dict | None = None) -> Log:
    """A server admitting 2 requests every 2 s, with a shed summary every `shed_every` rounds (10 s at 5)."""
    log = Log("0.5.23").start(Startup(max_running=128), **(args or ARGS))
    token = int(usage * 665690)
    for i in range(n):
        log.add(lf.prefill("0.5.23", new_seq=2, new_token=1000, cached=0, running=running, queue=20, usage=usage,
                           token=token), dt=1)
        log.add(lf.decode("0.5.23", running=running, token=token, usage=usage, throughput=3000, queue=20), dt=1)
        if shed_every and i % shed_every == 0:
            reasons = {k: v for k, v in (("queue_full", queue_full), ("waiting_timeout", waiting_timeout)) if v}
            log.add(lf.shed(first=i == 0, **reasons), scheduler=False)
    return log


def test_the_runtime_shed_summary_is_read_with_its_counts() -> None:
    lines = [lf.prefix("0.5.23", lf.T0, scheduler=False) + lf.shed(first=True, queue_full=1),
             lf.prefix("0.5.23", lf.T0 + 10, scheduler=False) + lf.shed(queue_full=9, waiting_timeout=3),
             lf.prefix("0.5.23", lf.T0 + 11) + lf.queue_timeout(3, 5.0, 7),
             lf.prefix("0.5.23", lf.T0 + 12, scheduler=False) + lf.client_gone("POST", "/v1/completions"),
             lf.prefix("0.5.23", lf.T0 + 13, scheduler=False) + lf.SGLANG_CLIENT_GONE.format(rid="ab12")]
    events = list(parse_lines(lines))
    assert [e.kind for e in events] == ["shed", "shed", "queue_timeout", "client_gone", "client_gone"]
    assert events[0].fields == {"shed": 1, "retry_after": 1, "queue_full": 1}
    assert events[1].fields == {"shed": 12, "seconds": 10, "retry_after": 1, "queue_full": 9, "waiting_timeout": 3}
    assert events[2].fields == {"aborted": 3, "waited_s": 5, "queue_req": 7}
    assert events[3].fields == {"method": "POST", "path": "/v1/completions"}
    assert [e.time for e in events] == [lf.T0, lf.T0 + 10, lf.T0 + 11, lf.T0 + 12, lf.T0 + 13]


def test_the_runtime_still_writes_the_lines_diagnose_reads() -> None:
    scheduler = (ROOT / "runtime" / "scheduler" / "scheduler.py").read_text()
    http = (ROOT / "runtime" / "server" / "http_server.py").read_text()
    assert ('f"Queue timeout: aborted {len(expired)} requests that waited more than {limit:g} s, "\n'
            '                    f"#queue-req: {len(self.waiting)}"') in scheduler
    assert lf.QUEUE_TIMEOUT.startswith("Queue timeout: aborted {n} requests that waited more than {limit:g} s, ")
    assert 'f"the client of {request.method} {request.path} disconnected before the response"' in http


def test_the_fast_path_reads_shed_lines_as_the_per_line_parser_does(tmp_path, monkeypatch) -> None:
    log = _serving(shed_every=3, waiting_timeout=2)
    log.add(lf.queue_timeout(2, 5.0, 18), dt=1).add(lf.client_gone(), scheduler=False)
    _same(tmp_path, monkeypatch, log.text().encode(), chunk=1024)


def test_sustained_shedding_with_a_full_pool_asks_for_another_replica() -> None:
    d = analyze(lines=_serving(shed_every=5).lines)
    f = _ids(d)["shedding.too_much"]
    assert f.severity == "warning" and f.change == Change("dp", "2") and f.current == "1"
    assert f.evidence.facts["shed"] == 48 and f.evidence.facts["admitted"] == 60
    assert f.evidence.count == 6 and "--dp-size 2" in d.command


def test_shedding_while_the_cap_binds_and_the_pool_has_room_raises_the_running_cap() -> None:
    d = analyze(lines=_serving(shed_every=5, usage=0.3, running=128).lines)
    f = _ids(d)["shedding.too_much"]
    # the cap the pool supports at 0.9 usage (128 x 0.9 / 0.3); shed requests are demand the queue does not show
    assert f.change == Change("running_cap", "384") and f.alternatives == (Change("dp", "2"),)
    assert f.current == "128"


def test_a_short_burst_of_shedding_is_not_a_finding() -> None:
    log = _serving(shed_every=0, n=60)
    log.add(lf.shed(first=True, queue_full=1), scheduler=False).add(lf.shed(queue_full=2), dt=10, scheduler=False)
    d = analyze(lines=log.lines)
    assert shed_of(Context(d.timeline)).total == 3
    assert "shedding.too_much" not in _ids(d) and "shedding.no_queue_cap" not in _ids(d)


def test_timed_out_requests_written_by_both_processes_are_counted_once() -> None:
    log = _serving(shed_every=5, queue_full=0, waiting_timeout=4)
    for _ in range(6):
        log.add(lf.queue_timeout(4, 5.0, 20), dt=1)
    shed = shed_of(Context(analyze(lines=log.lines).timeline))
    assert (shed.queue_full, shed.waiting_timeout) == (0, 24)


def test_a_sustained_run_is_measured_between_gaps() -> None:
    assert longest_run([0, 10, 20, 30, 100, 110]) == 30
    assert longest_run([0, 25, 50, 75]) == 75
    assert longest_run([5.0]) == 0.0


def _queue_growing(args: dict, disconnects: int) -> Log:
    log = Log("0.5.23").start(Startup(), **args)
    log.decode_series(40, running=100, queue=list(range(100, 100 + 40 * 40, 40)), usage=0.95)
    for _ in range(disconnects):
        log.add(lf.client_gone(), dt=1, scheduler=False)
    return log


def test_clients_giving_up_on_an_uncapped_queue_ask_for_max_queued_requests() -> None:
    d = analyze(lines=_queue_growing({"model_path": "m", "max_queued_requests": None}, 4).lines)
    f = _ids(d)["shedding.no_queue_cap"]
    assert f.severity == "warning" and f.change == Change("max_queued", "100") and f.current == "not set"
    assert f.flag == "--max-queued-requests" and f.evidence.facts["disconnects"] == 4
    assert "--max-queued-requests 100" in d.command


def test_a_queue_growing_without_disconnects_is_a_suggestion() -> None:
    d = analyze(lines=_queue_growing({"model_path": "m"}, 0).lines)
    f = _ids(d)["shedding.no_queue_cap"]
    assert f.severity == "info" and f.evidence.facts["last_quarter_queue"] > f.evidence.facts["first_quarter_queue"]


def test_a_capped_queue_is_not_advised_again() -> None:
    d = analyze(lines=_queue_growing({"model_path": "m", "max_queued_requests": 64}, 4).lines)
    assert "shedding.no_queue_cap" not in _ids(d) and d.config.max_queued_requests == 64


def test_a_steady_queue_and_a_few_disconnects_are_not_a_finding() -> None:
    log = Log("0.5.23").start(Startup(), model_path="m").decode_series(40, running=100, queue=300, usage=0.95)
    log.add(lf.client_gone(), dt=1, scheduler=False)
    assert "shedding.no_queue_cap" not in _ids(analyze(lines=log.lines))


def test_vllm_has_no_queue_cap_flag_so_the_advice_is_an_action() -> None:
    log = VllmLog().start().stats_series(40, running=100, waiting=list(range(100, 1700, 40)), usage=0.95, gen=3000.0)
    f = _ids(analyze(lines=log.lines))["shedding.no_queue_cap"]
    assert f.change is None and f.flag is None and f.engine == "vllm"
    assert f.action == "cap the queue in front of the server (router / gateway)"
    assert [a.as_flag("vllm") for a in f.alternatives] == ["--data-parallel-size 2"]
