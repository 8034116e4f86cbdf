"""Worker-hours for N trajectories of S steps, from measured phase times.

The form used by the substrate-comparison literature::

    worker_hours = (cold_start + steps x per_step_overhead + verify) x trajectories / 3600

with each term measured from the ledger's phase timings of valid attempts on one substrate:

- ``cold_start`` — the start cost of a trajectory in a long run, *as the substrate resets*: the
  reset of attempts that reused a sandbox (with ``recreate`` that reset destroys the sandbox and
  creates a fresh one; with ``in_place`` it empties the sandbox). A worker's first sandbox is created
  once and spread over all its trajectories, so in a million-trajectory run it adds nothing per
  trajectory; its creation time is shown beside the term as ``provision`` and the start of a
  trajectory in a fresh sandbox (provision + reset) as ``fresh_start``. When no attempt reused a
  sandbox, ``cold_start`` is the fresh start;
- ``per_step_overhead`` — mean seconds per environment step (all steps of all attempts);
- ``verify`` — mean verifier time.

The check against real trajectories compares like with like: the projected start term is weighted
by the share of the real trajectories that started in a fresh sandbox.

Attempt time outside those phases (gates: fingerprint check, first observation, canary plant and
scan; policy; teardown) is ``harness``; the *full* projection adds it. Intervals: percentile
bootstrap over attempts (2,000 resamples), all terms resampled together, so the interval of the sum
keeps their correlation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from drumsbench.measure.stats import CONFIDENCE, Estimate

PROJECTION_SCHEMA = "drumsbench.projection/1"
BOOTSTRAP = 2000

# ledger columns a projection reads, in this order
COLUMNS = ("outcome", "provision_s", "reset_s", "steps_s", "verify_s", "teardown_s", "t_start", "t_end")


class Terms(BaseModel):
    """Measured per-trajectory terms of one substrate configuration (seconds)."""

    n: int
    mean_steps: float
    provision: Estimate  # sandbox creation, over the attempts that created one
    reset: Estimate  # over all attempts
    fresh_start: Estimate  # provision + reset of the attempts that created their sandbox
    cold_start: Estimate  # the formula's term: start of a trajectory in a long run (see module doc)
    per_step: Estimate
    verify: Estimate
    harness: Estimate
    attempt: Estimate  # measured whole attempt
    method: str = f"percentile bootstrap over attempts, {BOOTSTRAP} resamples"


class Paired(BaseModel):
    """Projected vs measured, round by round (calibration and real trajectories run back to back)."""

    rounds: int
    projected_total_s: float
    measured_total_s: float
    error: float  # sum of projected / sum of measured - 1 (literature form)
    error_full: float
    error_interval: list[float]  # bootstrap over rounds, literature form


class Check(BaseModel):
    n: int
    mean_steps: float
    fresh_share: float  # share of the real trajectories that started in a fresh sandbox
    measured_s: Estimate
    projected_s: Estimate  # the literature form at the measured mean step count, from all calibration
    projected_full_s: Estimate
    error: float  # projected / measured - 1, pooled over the whole calibration
    error_full: float
    paired: Paired | None = None  # round by round, when calibration and check alternated
    tolerance: float
    within: bool  # |error| <= tolerance


class Projection(BaseModel):
    label: str
    substrate: str
    reset: str
    concurrency: int
    source: list[str]
    terms: Terms
    trajectories: int
    steps: int
    per_trajectory_s: Estimate
    per_trajectory_full_s: Estimate
    worker_hours: Estimate
    worker_hours_full: Estimate
    check: Check | None = None


class _Arrays:
    def __init__(self, rows: Sequence[Sequence[Any]]) -> None:
        valid = [r for r in rows if r[0] != "invalid"]
        self.n = len(valid)
        self.provision = np.array([r[1] for r in valid], dtype=float)
        self.reset = np.array([r[2] for r in valid], dtype=float)
        steps = [json.loads(r[3]) if isinstance(r[3], str) else list(r[3]) for r in valid]
        self.step_sum = np.array([sum(s) for s in steps], dtype=float)
        self.step_n = np.array([len(s) for s in steps], dtype=float)
        self.verify = np.array([r[4] for r in valid], dtype=float)
        self.teardown = np.array([r[5] for r in valid], dtype=float)
        self.attempt = np.array([r[7] - r[6] for r in valid], dtype=float)
        self.start = self.provision + self.reset
        self.fresh = self.provision > 0
        self.harness = np.maximum(0.0, self.attempt - self.start - self.step_sum - self.verify)

    def start_term(self, idx: np.ndarray | None, fresh_share: float | None) -> np.ndarray | float:
        """Start per trajectory: warm resets (steady state) or, with ``fresh_share``, a mix with fresh starts.

        ``idx``: bootstrap index matrix (one resample per row) or None for the point estimate.
        """
        if idx is None:
            idx = np.arange(self.n)[None, :]
        fresh = self.fresh[idx]
        n_fresh = fresh.sum(axis=1)
        n_warm = (~fresh).sum(axis=1)
        all_mean = self.start[idx].mean(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            warm = np.where(n_warm > 0, (self.reset[idx] * ~fresh).sum(axis=1) / np.maximum(n_warm, 1), all_mean)
            fresh_mean = np.where(n_fresh > 0, (self.start[idx] * fresh).sum(axis=1) / np.maximum(n_fresh, 1),
                                  all_mean)
        out = warm if fresh_share is None else fresh_share * fresh_mean + (1 - fresh_share) * warm
        return out if out.shape[0] > 1 else float(out[0])


def _est(point: float, boot: np.ndarray, n: int, method: str) -> Estimate:
    a = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(boot, [a, 1 - a]) if len(boot) else (point, point)
    return Estimate(value=float(point), low=float(min(lo, point)), high=float(max(hi, point)), n=n, method=method)


def _none(n: int = 0) -> Estimate:
    return Estimate(value=None, low=None, high=None, n=n, method="no data")


def _idx(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP, n))


def _mean(x: np.ndarray, idx: np.ndarray, method: str) -> Estimate:
    if len(x) == 0:
        return _none()
    return _est(float(x.mean()), x[idx].mean(axis=1), len(x), method)


def measure_terms(rows: Sequence[Sequence[Any]], seed: int = 0) -> Terms | None:
    """Terms from ledger rows (``COLUMNS``); None when no valid attempt."""
    a = _Arrays(rows)
    if a.n == 0:
        return None
    idx = _idx(a.n, seed)
    m = "bootstrap mean"
    created = a.provision[a.provision > 0]
    provision = _mean(created, _idx(len(created), seed + 1), m) if len(created) else _none()
    steps_total = a.step_n.sum()
    if steps_total > 0:
        boot_n = a.step_n[idx].sum(axis=1)
        boot = a.step_sum[idx].sum(axis=1) / np.maximum(boot_n, 1)
        per_step = _est(float(a.step_sum.sum() / steps_total), boot, int(steps_total), "bootstrap ratio of sums")
    else:
        per_step = Estimate(value=0.0, low=0.0, high=0.0, n=0, method="no steps")
    fresh = a.start[a.fresh]
    fresh_start = _mean(fresh, _idx(len(fresh), seed + 3), m) if len(fresh) else _none()
    cold = _est(float(a.start_term(None, None)), np.asarray(a.start_term(idx, None)), a.n,
                "bootstrap mean of warm resets")
    return Terms(n=a.n, mean_steps=float(a.step_n.mean()), provision=provision, reset=_mean(a.reset, idx, m),
                 fresh_start=fresh_start, cold_start=cold, per_step=per_step, verify=_mean(a.verify, idx, m),
                 harness=_mean(a.harness, idx, m), attempt=_mean(a.attempt, idx, m))


def per_trajectory(rows: Sequence[Sequence[Any]], steps: float, full: bool, seed: int = 0,
                   fresh_share: float | None = None, boot: bool = True) -> Estimate:
    """Projected seconds per trajectory of ``steps`` steps, bootstrap over attempts.

    ``fresh_share``: the share of trajectories that start in a fresh sandbox (None: a long run, where
    only resets count).
    """
    a = _Arrays(rows)
    if a.n == 0:
        return _none()
    idx = _idx(a.n, seed) if boot else None

    def form(ix: np.ndarray | None) -> np.ndarray | float:
        def sel(x: np.ndarray) -> np.ndarray:
            return x[None, :] if ix is None else x[ix]

        per = sel(a.step_sum).sum(axis=1) / np.maximum(sel(a.step_n).sum(axis=1), 1)
        out = np.asarray(a.start_term(ix, fresh_share)) + steps * per + sel(a.verify).mean(axis=1)
        if full:
            out = out + sel(a.harness).mean(axis=1)
        return out if ix is not None else float(np.ravel(out)[0])

    what = "cold_start + steps x per_step + verify" + (" + harness" if full else "")
    if not boot:
        point = float(form(None))
        return Estimate(value=point, low=point, high=point, n=a.n, method=what)
    return _est(float(form(None)), np.asarray(form(idx)), a.n, f"{what}; bootstrap over attempts")


def _hours(e: Estimate, trajectories: int) -> Estimate:
    if e.value is None:
        return e
    f = trajectories / 3600
    return e.model_copy(update={"value": e.value * f, "low": (e.low or 0) * f, "high": (e.high or 0) * f,
                                "method": e.method + f"; x {trajectories} / 3600"})


def project(label: str, substrate: str, reset: str, concurrency: int, source: list[str],
            rows: Sequence[Sequence[Any]], trajectories: int, steps: int, seed: int = 0) -> Projection | None:
    terms = measure_terms(rows, seed)
    if terms is None:
        return None
    lit = per_trajectory(rows, steps, full=False, seed=seed)
    full = per_trajectory(rows, steps, full=True, seed=seed)
    return Projection(label=label, substrate=substrate, reset=reset, concurrency=concurrency, source=source,
                      terms=terms, trajectories=trajectories, steps=steps, per_trajectory_s=lit,
                      per_trajectory_full_s=full, worker_hours=_hours(lit, trajectories),
                      worker_hours_full=_hours(full, trajectories))


def _paired(calib_rounds: dict[int, list[Sequence[Any]]], real_rounds: dict[int, list[Sequence[Any]]],
            seed: int) -> Paired | None:
    rounds = sorted(set(calib_rounds) & set(real_rounds))
    if len(rounds) < 2:
        return None
    proj, proj_full, meas = [], [], []
    for r in rounds:
        real = _Arrays(real_rounds[r])
        if real.n == 0 or _Arrays(calib_rounds[r]).n == 0:
            continue
        steps, share = float(real.step_n.mean()), float(real.fresh.mean())
        proj.append(real.n * (per_trajectory(calib_rounds[r], steps, False, seed, share, boot=False).value or 0))
        proj_full.append(real.n * (per_trajectory(calib_rounds[r], steps, True, seed, share, boot=False).value or 0))
        meas.append(float(real.attempt.sum()))
    if len(meas) < 2:
        return None
    p, pf, m = np.array(proj), np.array(proj_full), np.array(meas)
    idx = _idx(len(m), seed + 4)
    boot = p[idx].sum(axis=1) / m[idx].sum(axis=1) - 1
    a = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return Paired(rounds=len(m), projected_total_s=float(p.sum()), measured_total_s=float(m.sum()),
                  error=float(p.sum() / m.sum() - 1), error_full=float(pf.sum() / m.sum() - 1),
                  error_interval=[float(lo), float(hi)])


def check(p: Projection, calib_rows: Sequence[Sequence[Any]], real_rows: Sequence[Sequence[Any]],
          tolerance: float, seed: int = 0, calib_rounds: dict[int, list[Sequence[Any]]] | None = None,
          real_rounds: dict[int, list[Sequence[Any]]] | None = None) -> Check | None:
    """Compare the projection (at the real runs' mean step count) with the real runs' time per trajectory.

    With rounds (calibration and real trajectories alternating, so that a load that comes and goes
    on a shared host meets both alike), the interval of the error is a bootstrap over rounds, which
    keeps each round's calibration with the real trajectories run right after it. With rounds of
    equal size the paired point error equals the pooled one (the form is linear in the sums).
    """
    real = _Arrays(real_rows)
    if real.n == 0:
        return None
    steps = float(real.step_n.mean())
    share = float(real.fresh.mean())
    measured = _mean(real.attempt, _idx(real.n, seed + 2), "bootstrap mean of real trajectories")
    lit = per_trajectory(calib_rows, steps, full=False, seed=seed, fresh_share=share)
    full = per_trajectory(calib_rows, steps, full=True, seed=seed, fresh_share=share)
    mv = measured.value or float("nan")
    err = (lit.value or 0) / mv - 1
    err_full = (full.value or 0) / mv - 1
    paired = _paired(calib_rounds or {}, real_rounds or {}, seed) if calib_rounds and real_rounds else None
    return Check(n=real.n, mean_steps=steps, fresh_share=share, measured_s=measured, projected_s=lit,
                 projected_full_s=full, error=err, error_full=err_full, paired=paired, tolerance=tolerance,
                 within=abs(err) <= tolerance)
