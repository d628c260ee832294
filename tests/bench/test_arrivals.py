"""The arrival schedule is a pure seeded function with the statistics each process promises."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from toolkit.bench.arrivals import schedule


def test_poisson_gaps_pass_a_ks_test_against_the_exponential():
    rate = 40.0
    gaps = np.diff(schedule(rate, num_requests=4000, arrival="poisson", seed=11))
    assert stats.kstest(gaps, "expon", args=(0.0, 1.0 / rate)).pvalue > 0.01
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.05)


def test_gamma_with_burstiness_one_is_poisson():
    gaps = np.diff(schedule(10.0, num_requests=4000, arrival="gamma", burstiness=1.0, seed=5))
    assert stats.kstest(gaps, "expon", args=(0.0, 0.1)).pvalue > 0.01


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 8.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation_and_keeps_the_mean(burstiness):
    rate = 20.0
    gaps = np.diff(schedule(rate, num_requests=20000, arrival="gamma", burstiness=burstiness, seed=2))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0 / np.sqrt(burstiness), rel=0.08)
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.05)
    assert stats.kstest(gaps, "gamma", args=(burstiness, 0.0, 1.0 / (rate * burstiness))).pvalue > 0.01


def test_lower_burstiness_is_burstier():
    cv = [np.std(g) / np.mean(g) for g in (
        np.diff(schedule(5.0, num_requests=5000, arrival="gamma", burstiness=b, seed=1)) for b in (0.2, 1.0, 5.0))]
    assert cv[0] > cv[1] > cv[2]


def test_constant_arrivals_are_exact():
    offsets = schedule(8.0, num_requests=1001, arrival="constant")
    assert np.array_equal(offsets, np.arange(1001) / 8.0)
    assert offsets[1000] == 125.0


def test_schedules_are_absolute_offsets_starting_at_zero_and_never_decreasing():
    offsets = schedule(100.0, num_requests=500, arrival="gamma", burstiness=0.3, seed=9)
    assert offsets[0] == 0.0
    assert np.all(np.diff(offsets) >= 0)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    a, b = (schedule(7.0, num_requests=100, seed=4) for _ in range(2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, schedule(7.0, num_requests=100, seed=5))


def test_infinite_rate_sends_everything_at_once():
    assert np.array_equal(schedule(float("inf"), num_requests=5), np.zeros(5))


def test_duration_keeps_the_arrivals_before_it():
    offsets = schedule(50.0, duration=4.0, seed=3)
    assert offsets[-1] < 4.0 and len(offsets) == pytest.approx(200, rel=0.2)
    assert len(schedule(4.0, duration=2.5, arrival="constant")) == 10
    assert len(schedule(4.0, duration=2.0, arrival="constant")) == 8


@pytest.mark.parametrize("kwargs", [
    dict(rate=0.0, num_requests=3), dict(rate=-1.0, num_requests=3), dict(rate=1.0),
    dict(rate=1.0, num_requests=3, duration=1.0), dict(rate=float("inf"), duration=2.0),
    dict(rate=1.0, num_requests=3, arrival="uniform"), dict(rate=1.0, num_requests=3, arrival="gamma", burstiness=0),
])
def test_bad_schedule_arguments_are_value_errors(kwargs):
    rate = kwargs.pop("rate")
    with pytest.raises(ValueError):
        schedule(rate, **kwargs)
