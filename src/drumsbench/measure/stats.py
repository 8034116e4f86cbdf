"""Intervals for every number DrumsBench prints.

- rates (success rate, invalid rate): Wilson score interval;
- quantiles of latencies: distribution-free interval from order statistics (binomial), which is
  exact for any continuous distribution and needs no resampling (fast on 100,000 attempts);
- throughput (events per hour): bootstrap over equal time bins of the measured span, which keeps
  the burstiness of real completions; with fewer than 5 bins, an exact Poisson interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel

CONFIDENCE = 0.95


class Estimate(BaseModel, frozen=True):
    value: float | None
    low: float | None
    high: float | None
    n: int
    method: str

    def fmt(self, spec: str = ".3g", unit: str = "") -> str:
        if self.value is None:
            return "n/a"
        u = f" {unit}" if unit else ""
        return f"{self.value:{spec}}{u} [{self.low:{spec}}, {self.high:{spec}}]"


def wilson(k: int, n: int, conf: float = CONFIDENCE) -> Estimate:
    if n == 0:
        return Estimate(value=None, low=None, high=None, n=0, method="wilson")
    z = NormalDist().inv_cdf(0.5 + conf / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return Estimate(value=p, low=low, high=high, n=n, method="wilson")


def binom_ppf(q: float, n: int, p: float) -> float:
    """``scipy.stats.binom.ppf(q, n, p)`` for 0 < q < 1: the very ufunc it calls, without importing
    scipy.stats (which costs one to a few seconds at start-up); scipy.stats where that ufunc is absent."""
    try:
        from scipy.special._ufuncs import _binom_ppf
    except ImportError:  # another scipy layout
        from scipy import stats

        return float(stats.binom.ppf(q, n, p))
    return float(_binom_ppf(q, n, p))


def quantile(values: Sequence[float] | np.ndarray, q: float, conf: float = CONFIDENCE) -> Estimate:
    x = np.asarray(values, dtype=float)
    if len(x) > 1 and not np.all(x[1:] >= x[:-1]):  # a caller may pass sorted values: sort only when needed
        x = np.sort(x)
    n = len(x)
    if n == 0:
        return Estimate(value=None, low=None, high=None, n=0, method="order-statistics")
    value = float(np.quantile(x, q))
    lo_i = int(binom_ppf((1 - conf) / 2, n, q))
    hi_i = int(binom_ppf(1 - (1 - conf) / 2, n, q))
    low = float(x[max(0, min(n - 1, lo_i - 1))])
    high = float(x[max(0, min(n - 1, hi_i))])
    return Estimate(value=value, low=min(low, value), high=max(high, value), n=n, method="order-statistics")


def rate_per_hour(event_times: Sequence[float] | np.ndarray, span_s: float, bins: int = 20, seed: int = 0,
                  conf: float = CONFIDENCE) -> Estimate:
    """Events per hour over a measured span; ``event_times`` are offsets in seconds within it."""
    n = len(event_times)
    if span_s <= 0:
        return Estimate(value=None, low=None, high=None, n=n, method="none")
    value = n / span_s * 3600
    nbins = min(bins, max(1, int(span_s)))  # bins of at least a second
    if nbins >= 5 and n > 0:
        counts = np.histogram(np.clip(event_times, 0, span_s), bins=nbins, range=(0, span_s))[0]
        width_h = span_s / nbins / 3600
        rng = np.random.default_rng(seed)
        means = rng.choice(counts, size=(2000, nbins), replace=True).mean(axis=1) / width_h
        low, high = np.quantile(means, [(1 - conf) / 2, 1 - (1 - conf) / 2])
        return Estimate(value=value, low=float(min(low, value)), high=float(max(high, value)), n=n,
                        method=f"bootstrap over {nbins} time bins")
    from scipy import stats

    a = (1 - conf) / 2
    low = stats.chi2.ppf(a, 2 * n) / 2 if n > 0 else 0.0
    high = stats.chi2.ppf(1 - a, 2 * n + 2) / 2
    per_hour = 3600 / span_s
    return Estimate(value=value, low=low * per_hour, high=high * per_hour, n=n, method="exact poisson")


def scale(e: Estimate, factor: float) -> Estimate:
    """An estimate multiplied by a positive constant."""
    if e.value is None:
        return e
    return e.model_copy(update={"value": e.value * factor, "low": (e.low or 0) * factor,
                                "high": (e.high or 0) * factor})


def inverse(e: Estimate, numerator: float) -> Estimate:
    """numerator / e, with the interval carried through (bounds swap)."""
    if e.value is None or e.value == 0:
        return Estimate(value=None, low=None, high=None, n=e.n, method=e.method)
    low = numerator / e.high if e.high else None
    high = numerator / e.low if e.low else math.inf
    return Estimate(value=numerator / e.value, low=low, high=high, n=e.n, method=e.method)


def rate_ratio(times_a: Sequence[float], span_a: float, times_b: Sequence[float], span_b: float, bins: int = 20,
               seed: int = 0, conf: float = CONFIDENCE) -> Estimate:
    """(events per hour over span a) / (events per hour over span b). The interval: a bootstrap over
    each span's equal time bins (as ``rate_per_hour``), the two resampled independently; when either
    span has fewer than 5 bins, the exact conditional interval for a ratio of Poisson rates
    (Clopper-Pearson on a's share of all the events). No value when b has no event."""
    n_a, n_b = len(times_a), len(times_b)
    if span_a <= 0 or span_b <= 0 or n_b == 0:
        return Estimate(value=None, low=None, high=None, n=n_a + n_b, method="none")
    value = (n_a / span_a) / (n_b / span_b)
    k_a, k_b = min(bins, max(1, int(span_a))), min(bins, max(1, int(span_b)))
    if k_a >= 5 and k_b >= 5:
        rng = np.random.default_rng(seed)

        def means(times: Sequence[float], span: float, k: int) -> np.ndarray:
            counts = np.histogram(np.clip(times, 0, span), bins=k, range=(0, span))[0]
            drawn: np.ndarray = rng.choice(counts, size=(2000, k), replace=True).mean(axis=1) / (span / k)
            return drawn

        a, b = means(times_a, span_a, k_a), means(times_b, span_b, k_b)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(b > 0, a / np.where(b > 0, b, 1), np.inf)
        low, high = (float(np.quantile(r, q, method="inverted_cdf")) for q in ((1 - conf) / 2, 1 - (1 - conf) / 2))
        return Estimate(value=value, low=min(low, value), high=max(high, value), n=n_a + n_b,
                        method=f"bootstrap over {k_a} and {k_b} time bins")
    from scipy import stats

    alpha = (1 - conf) / 2
    lo_p = float(stats.beta.ppf(alpha, n_a, n_b + 1)) if n_a > 0 else 0.0
    hi_p = float(stats.beta.ppf(1 - alpha, n_a + 1, n_b))
    odds = span_b / span_a
    high = math.inf if hi_p >= 1 else hi_p / (1 - hi_p) * odds
    return Estimate(value=value, low=lo_p / (1 - lo_p) * odds, high=high, n=n_a + n_b,
                    method="exact conditional (Poisson rates)")


def median_ratio(a: Sequence[float], b: Sequence[float], seed: int = 0, conf: float = CONFIDENCE,
                 reps: int = 2000) -> Estimate:
    """median(a) / median(b), with a percentile bootstrap interval (a and b resampled independently).
    No value when either is empty or b's median is 0."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) == 0 or len(y) == 0 or float(np.median(y)) <= 0:
        return Estimate(value=None, low=None, high=None, n=len(x) + len(y), method="none")
    value = float(np.median(x) / np.median(y))
    rng = np.random.default_rng(seed)
    mx = np.median(rng.choice(x, size=(reps, len(x)), replace=True), axis=1)
    my = np.median(rng.choice(y, size=(reps, len(y)), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(my > 0, mx / np.where(my > 0, my, 1), np.inf)
    low, high = (float(np.quantile(r, q, method="inverted_cdf")) for q in ((1 - conf) / 2, 1 - (1 - conf) / 2))
    return Estimate(value=value, low=min(low, value), high=max(high, value), n=len(x) + len(y),
                    method=f"bootstrap of medians ({len(x)} and {len(y)} samples)")
