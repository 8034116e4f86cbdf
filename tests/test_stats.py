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


def test_rate_ratio_value_interval_and_exact_fallback():
    from scipy import stats

    from drumsbench.measure.stats import rate_ratio

    rng = np.random.default_rng(3)
    a, b = np.sort(rng.uniform(0, 100, 400)), np.sort(rng.uniform(0, 200, 200))
    e = rate_ratio(a, 100.0, b, 200.0)  # 4/s against 1/s
    assert e.value == 4.0 and e.low < 4.0 < e.high and e.method.startswith("bootstrap")
    # under 5 s: the exact conditional interval (Clopper-Pearson on a's share of the 3 + 1 events)
    x = rate_ratio([0.5, 1.0, 2.0], 3.0, [1.0], 3.0)
    assert x.value == 3.0 and x.method.startswith("exact")
    lo_p, hi_p = stats.beta.ppf(0.025, 3, 2), stats.beta.ppf(0.975, 4, 1)
    assert abs(x.low - lo_p / (1 - lo_p)) < 1e-9 and abs(x.high - hi_p / (1 - hi_p)) < 1e-9
    assert rate_ratio([1.0], 10.0, [], 10.0).value is None  # nothing to divide by


def test_rate_ratio_interval_covers_the_true_ratio():
    from drumsbench.measure.stats import rate_ratio

    rng = np.random.default_rng(4)
    covered = 0
    for _ in range(200):
        a = np.sort(rng.uniform(0, 60, rng.poisson(30)))
        b = np.sort(rng.uniform(0, 60, rng.poisson(15)))
        e = rate_ratio(a, 60.0, b, 60.0)
        covered += e.low <= 2.0 <= e.high
    assert covered >= 175  # nominal 95 %


def test_median_ratio():
    from drumsbench.measure.stats import median_ratio

    e = median_ratio([2.0, 2.1, 1.9, 2.2], [0.2, 0.21, 0.19])
    assert abs(e.value - 2.05 / 0.2) < 1e-9 and e.low <= e.value <= e.high
    assert e.low >= 1.9 / 0.21 - 1e-9 and e.high <= 2.2 / 0.19 + 1e-9  # within what the samples allow
    assert median_ratio([1.0], []).value is None and median_ratio([1.0], [0.0]).value is None
