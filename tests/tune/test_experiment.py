"""One step's I/O on fakes: repeats, a launch that fails, a server that dies mid-run, every request failing, and
Ctrl-C — the server is stopped every time."""
from __future__ import annotations

import pytest

from tests.tune.fakes import LOW_USAGE, FakeDoctor, FakeLauncher, FakeWorkload
from toolkit.tune.experiment import Experiment, RunError
from toolkit.tune.flags import Flags


def experiment(tmp_path, launcher, workload, doctor=None, repeats=3):
    events: list[str] = []
    exp = Experiment(launcher, workload, doctor or FakeDoctor(), repeats, tmp_path,
                     on_event=lambda index, what: events.append(what))
    return exp, events


def test_a_configuration_runs_r_times_on_one_launch_then_is_stopped_and_diagnosed(tmp_path):
    launcher, doctor = FakeLauncher(), FakeDoctor()
    exp, events = experiment(tmp_path, launcher, FakeWorkload([100.0, 104.0, 102.0]), doctor)
    trial = exp(Flags.parse("--a 1"), 3)
    assert trial.ok and trial.values == (100.0, 104.0, 102.0) and len(trial.records) == 3
    assert trial.findings == (LOW_USAGE,) and trial.folder == str(tmp_path / "step-03")
    assert launcher.servers[0].stopped and doctor.seen == [(tmp_path / "step-03" / "server.log", 3)]
    assert events == ["launching", "run 1/3", "run 2/3", "run 3/3", "stopping the server", "diagnosing"]


def test_a_launch_that_fails_is_a_failed_trial_with_the_logs_diagnosis(tmp_path):
    launcher = FakeLauncher(fail="the server exited with code 1:\nload weights\nOOM: not enough memory\n",
                            log_line="Not enough memory")
    exp, _ = experiment(tmp_path, launcher, FakeWorkload([1.0] * 3))
    trial = exp(Flags(), 1)
    assert not trial.ok and trial.error.startswith("launch failed: the server exited with code 1")
    assert "OOM" in trial.error and trial.verdict == "read Not enough memory" and trial.values == ()


def test_a_server_that_dies_during_the_runs_fails_the_trial(tmp_path):
    launcher = FakeLauncher(dies_after=2)
    exp, _ = experiment(tmp_path, launcher, FakeWorkload([1.0, 2.0, 3.0]))
    trial = exp(Flags(), 1)
    assert trial.error == "the server exited during the run" and trial.values == (1.0,)
    assert len(trial.records) == 2 and launcher.servers[0].stopped


def test_every_request_failing_fails_the_trial(tmp_path):
    exp, _ = experiment(tmp_path, FakeLauncher(), FakeWorkload([0.0] * 3, completed=0))
    trial = exp(Flags(), 1)
    assert not trial.ok and trial.error.startswith("every request failed") and "http_500" in trial.error


def test_a_workload_that_cannot_run_fails_the_trial(tmp_path):
    launcher = FakeLauncher()
    exp, _ = experiment(tmp_path, launcher, FakeWorkload([1.0] * 3, raise_at=0, error=RunError("cannot reach it")))
    trial = exp(Flags(), 1)
    assert trial.error == "cannot reach it" and launcher.servers[0].stopped


def test_ctrl_c_during_a_run_stops_the_server_and_propagates(tmp_path):
    launcher = FakeLauncher()
    exp, _ = experiment(tmp_path, launcher, FakeWorkload([1.0] * 3, raise_at=1, error=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        exp(Flags(), 1)
    assert launcher.servers[0].stopped
