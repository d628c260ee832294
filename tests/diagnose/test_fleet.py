"""A fleet (one log per worker): each worker diagnosed alone, then compared (`diagnose/fleet.py`): unbalanced load,
one worker retracting while others have room, a missing worker; and `toolkit diagnose DIR` / `--fleet`."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup
from toolkit.cli import app
from toolkit.diagnose.fleet import analyze_fleet, worker_names

runner = CliRunner()


def _worker(folder: Path, name: str, *, running: int = 100, n: int = 60, usage: float = 0.5,
            retract_every: int = 0, start: float = lf.T0) -> Path:
    log = Log("0.5.23", t=start).start(Startup(), model_path="m")
    for i in range(n):
        log.add(lf.decode("0.5.23", running=running, token=int(usage * 665690), usage=usage,
                          throughput=30.0 * running, queue=2), dt=2)
        if retract_every and i % retract_every == 0:
            log.add(lf.retract("0.5.23", k=1, old=0.5, new=0.8))
    path = folder / name
    path.write_text(log.text())
    return path


def _fleet_ids(fleet) -> dict[str, object]:
    return {f.id: f for f in fleet.findings}


def test_a_balanced_fleet_has_no_fleet_findings(tmp_path) -> None:
    fleet = analyze_fleet([_worker(tmp_path, "a.log"), _worker(tmp_path, "b.log", running=90)])
    assert fleet.findings == [] and [w.name for w in fleet.workers] == ["a", "b"]
    assert [round(load.running) for load in fleet.loads] == [100, 90]


def test_one_worker_with_twice_the_load_is_an_imbalance_with_no_server_flag(tmp_path) -> None:
    fleet = analyze_fleet([_worker(tmp_path, "a.log", running=120), _worker(tmp_path, "b.log", running=40)])
    f = _fleet_ids(fleet)["fleet.imbalance"]
    assert f.change is None and f.flag is None and f.alternatives == ()
    assert "not a server flag" in f.message and f.action.startswith("router:")
    assert f.evidence.facts["a.running"] == 120 and f.evidence.facts["b.running"] == 40
    assert f.evidence.facts["a.throughput"] == 3600 and f.evidence.span == fleet.window


def test_retracting_while_another_worker_has_free_kv(tmp_path) -> None:
    fleet = analyze_fleet([_worker(tmp_path, "hot.log", usage=0.95, retract_every=10),
                           _worker(tmp_path, "calm.log", usage=0.2)])
    f = _fleet_ids(fleet)["fleet.retracting_while_others_idle"]
    assert f.evidence.facts["worker"] == "hot" and f.evidence.facts["hot.retractions"] == 6
    assert f.evidence.facts["calm.usage"] == 0.2 and "fleet.imbalance" not in _fleet_ids(fleet)


def test_retractions_on_every_worker_are_not_a_routing_problem(tmp_path) -> None:
    fleet = analyze_fleet([_worker(tmp_path, "a.log", usage=0.95, retract_every=10),
                           _worker(tmp_path, "b.log", usage=0.2, retract_every=10)])
    assert "fleet.retracting_while_others_idle" not in _fleet_ids(fleet)


def test_a_log_that_stops_early_or_never_serves_is_a_missing_worker(tmp_path) -> None:
    silent = tmp_path / "silent.log"
    silent.write_text(Log("0.5.23").start(Startup(), model_path="m").text())
    fleet = analyze_fleet([_worker(tmp_path, "a.log"), _worker(tmp_path, "b.log"),
                           _worker(tmp_path, "early.log", n=10), silent])
    missing = {f.evidence.facts["worker"]: f for f in fleet.findings if f.id == "fleet.missing_worker"}
    assert sorted(missing) == ["early", "silent"]
    assert missing["early"].evidence.facts["ended_s_before_last"] == 100
    assert "no load lines" in missing["silent"].message
    assert fleet.window == (lf.T0, lf.T0 + 120)  # the window of the workers still running
    assert "fleet.imbalance" not in _fleet_ids(fleet)


def test_workers_are_named_by_their_file_stem_and_by_path_when_two_stems_match() -> None:
    assert worker_names(["/x/w1.log.gz", "/x/w2.txt", "/y/w3"]) == ["w1", "w2", "w3"]
    assert worker_names(["/x/w.log", "/y/w.log"]) == ["/x/w.log", "/y/w.log"]


def test_diagnose_a_directory_reports_each_worker_and_the_fleet_as_json(tmp_path) -> None:
    _worker(tmp_path, "w0.log", running=120)
    _worker(tmp_path, "w1.log", running=30)
    (tmp_path / "notes.json").write_text("{}")
    result = runner.invoke(app, ["diagnose", str(tmp_path), "--format", "json", "--fail-on", "warning"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "toolkit.diagnose.fleet/1"
    assert [(w["name"], w["diagnosis"]["schema"]) for w in doc["workers"]] == [
        ("w0", "toolkit.diagnose/1"), ("w1", "toolkit.diagnose/1")]
    first = doc["workers"][0]
    assert first["load"]["running"] == 120 and first["diagnosis"]["event_counts"]["decode"] == 60
    (f,) = doc["fleet_findings"]
    assert f["id"] == "fleet.imbalance" and f["change"] is None and f["evidence"]["facts"]["w1.running"] == 30


def test_diagnose_a_directory_as_text_names_each_worker(tmp_path) -> None:
    _worker(tmp_path, "w0.log")
    _worker(tmp_path, "w1.log", n=10)
    result = runner.invoke(app, ["diagnose", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Worker w0" in result.stdout and "Worker w1" in result.stdout
    assert "Worker w1 is missing from the fleet" in result.stdout


def test_several_files_are_one_server_unless_fleet_is_asked(tmp_path) -> None:
    logs = [str(_worker(tmp_path, "a.log", running=120)), str(_worker(tmp_path, "b.log", running=30))]
    one = json.loads(runner.invoke(app, ["diagnose", *logs, "--format", "json"]).stdout)
    assert one["schema"] == "toolkit.diagnose/1" and one["event_counts"]["decode"] == 120
    fleet = json.loads(runner.invoke(app, ["diagnose", *logs, "--fleet", "--format", "json"]).stdout)
    assert [f["id"] for f in fleet["fleet_findings"]] == ["fleet.imbalance"]


def test_a_fleet_refuses_single_server_inputs(tmp_path) -> None:
    log = str(_worker(tmp_path, "a.log"))
    result = runner.invoke(app, ["diagnose", log, "--fleet"])
    assert result.exit_code == 2 and "two or more worker logs" in result.output
    _worker(tmp_path, "b.log")
    result = runner.invoke(app, ["diagnose", str(tmp_path), "--export", str(tmp_path / "e.csv")])
    assert result.exit_code == 2 and "--export reads one server" in result.output
