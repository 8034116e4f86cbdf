"""Intervals: known values and coverage sanity."""

import numpy as np

from drumsbench.measure.stats import inverse, quantile, rate_per_hour, wilson


def test_wilson_known_value():
    e = wilson(8, 10)
    assert abs(e.low - 0.4902) < 1e-3 and abs(e.high - 0.9433) < 1e-3
    assert wilson(0, 0).value is None
    assert wilson(10, 10).high == 1.0


def test_quantile_interval_covers_true_median():
    rng = np.random.default_rng(1)
    covered = sum(
        (e := quantile(rng.exponential(1.0, 200), 0.5)).low <= np.log(2) <= e.high for _ in range(200))
    assert covered >= 180  # nominal 95 %


def test_rate_interval_and_inverse():
    rng = np.random.default_rng(2)
    times = np.sort(rng.uniform(0, 100, 500))
    e = rate_per_hour(times, 100.0)
    assert e.value == 500 / 100 * 3600 and e.low < e.value < e.high
    cost = inverse(e, 1.0)
    assert cost.low < cost.value < cost.high and abs(cost.value - 1 / e.value) < 1e-15
    poisson = rate_per_hour([0.5, 1.0], 3.0)
    assert poisson.method == "exact poisson" and poisson.low < poisson.value < poisson.high
