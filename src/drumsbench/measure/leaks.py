"""Leak accounting: the slope per hour of what a window's harness holds, with an interval, and the check.

``experiments.leak_sampler`` samples, beside every window of a sweep, the quantities of
``QUANTITIES`` (open fds of the harness, processes and zombies under it, mounts, entries in the
host's /tmp and /dev/shm, the sandbox store's disk use, dockerd's or podman's conmon memory) and
stores them as a ``leaks`` artifact (``measure.artifacts.LeakSamplesArtifact``). This module judges
them, from the ledger alone:

- **Span**: from the end of the ramp-up — the later of 10% of the planned length and the moment
  the N-th attempt of the window ended (every slot has been through one attempt) — to the end of
  the measured span (the planned length, or less when the window was cut short). The drain after
  the deadline and the teardown are outside (they fall by design).
- **Slope**: ordinary least squares of the quantity on time, in units per hour.
- **Interval**: the slope's Student-t interval with the sample size reduced for the lag-1
  autocorrelation r of the residuals (n_eff = n (1 - r) / (1 + r) when r > 0; Santer et al. 2000):
  samples taken seconds apart are not independent, and the plain t-interval would be too narrow.
  With n_eff < 4 there is no interval (the quantity is "not judged"). A window's verdict asks of
  every quantity at once whether it leaks, so each interval is at 1 - FAMILY_ALPHA/m for the m
  quantities measured (Bonferroni): the chance that a clean window shows any leak stays at most
  FAMILY_ALPHA = 1e-4, as the model has it. The model is optimistic: on clean 10-s windows of a
  coding sweep (2 slots, process) the slopes' z-scores under the lag-1 interval spread 1.1-1.3 times
  wider than the t they assume (in-flight fds of running attempts come and go in steps, not as
  AR(1) noise), and at 0.05/m a clean CI window failed (+1,970 fds/h [+636, +3,300]; at 95% each,
  another once showed +1,340 processes/h [+533, +2,140]). A real leak grows with the soak's length
  (its t-score as length^1.5), so the strict level costs a real soak little: at the noise of a 2-slot
  coding sweep (sd ~4 fds, a sample every 15 s) a 1-h soak's half-interval is ~4 fds/h, and a leak
  of 15 fds/h is called.
- **Steps** (a second rule, for staircases): the changes between consecutive samples, counted as
  rises and falls. A quantity that only steps up (a file or an fd per attempt) has residuals so
  autocorrelated that the interval above cannot be had from a short window, yet it is the plainest
  leak there is. A quantity that rose at least ``MIN_RISES`` times and never fell over the span is
  accumulating (were rises and falls equally likely, 6 rises and no fall would have a chance of
  2^-6 < 2.5%). A sign test on rises against falls is not used: a sawtooth (many small rises, a few
  large falls: fds opened one by one, closed in batches) rejects it with no trend at all.
- **Check**: a quantity *leaks* when its interval's low end is above zero and above its tolerance
  (``Quantity.tolerance_per_h``) and, for a count, comes to at least one whole unit over the span
  (``Quantity.counted``: on a 10-s window a zombie not yet reaped at the end gave a low end of +43
  zombies/h, 0.1 of a zombie), or when it only rose (``MIN_RISES`` times or more, no fall) and
  its rise over the span (last minus first sample, per hour) is above its tolerance; a window fails its
  leak check when any quantity leaks, and a soak that fails it is not confirmed
  (``measure.windows``: the check ``leaks``): a fleet that accumulates cannot hold its throughput
  for days, however good its first hour. A step window shows its leak check without counting it
  (its minutes are mostly warm-up), and a soak with too few independent samples is "not judged"
  and keeps its other checks' verdict.
- **Left**: each quantity after the window's teardown minus before the window (for information).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from drumsbench.measure.artifacts import LeakSamplesArtifact

CONFIDENCE = 0.95  # ``slope_interval``'s default
FAMILY_ALPHA = 1e-4  # the leak check's chance of calling a clean window leaking, over all its quantities
RAMP_FRACTION = 0.1
MIN_EFFECTIVE = 4.0
METHOD = ("least squares slope per hour; Student-t interval at 1 - 1e-4/m for the m quantities measured "
          "(Bonferroni), with n reduced for the lag-1 autocorrelation of the residuals; a quantity leaks when "
          "the interval's low end > max(0, tolerance), or when it rose at least 6 times and never fell over the "
          "span and its rise per hour > max(0, tolerance)")
MIN_RISES = 6


class Quantity(BaseModel, frozen=True):
    key: str
    label: str
    unit: str
    tolerance_per_h: float  # a slope below this is not called a leak, however sure
    # a count: a leak must come to at least one whole unit over the fitted span (a 10-s window whose
    # zombie count averaged half a zombie more at its end than at its start has not leaked a zombie)
    counted: bool = True


QUANTITIES: tuple[Quantity, ...] = (
    Quantity(key="fds", label="open fds (harness)", unit="fds", tolerance_per_h=5),
    Quantity(key="processes", label="processes under the harness", unit="processes", tolerance_per_h=5),
    Quantity(key="zombies", label="zombies under the harness", unit="zombies", tolerance_per_h=1),
    Quantity(key="mounts", label="mounts of the run (harness's mountinfo)", unit="mounts", tolerance_per_h=5),
    Quantity(key="tmp_entries", label="entries in the host's /tmp and other shared places", unit="entries",
             tolerance_per_h=5),
    Quantity(key="shm_entries", label="entries in /dev/shm", unit="entries", tolerance_per_h=5),
    Quantity(key="store_mib", counted=False, label="sandbox store disk use", unit="MiB", tolerance_per_h=20),
    Quantity(key="daemon_mib", counted=False, label="dockerd / podman conmon RSS", unit="MiB", tolerance_per_h=20),
)
BY_KEY = {q.key: q for q in QUANTITIES}
HOST_MOUNTS_LABEL = "mounts (the host's whole table, other users' included)"


class LeakSlope(BaseModel):
    key: str
    label: str
    unit: str
    samples: int
    first: float | None
    last: float | None
    per_hour: float | None
    low: float | None
    high: float | None
    n_effective: float | None
    tolerance_per_h: float
    leaks: bool | None  # None: not judged (too few independent samples, or not measured)
    rises: int | None = None  # sample-to-sample changes up / down over the span (the staircase rule)
    falls: int | None = None

    def fmt(self, spec: str = ".3g") -> str:
        """``slope [low, high]``; ``short``: ``slope ±half`` (the t-interval is symmetric)."""
        if self.per_hour is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.per_hour:+{spec}} [n/a]"
        return f"{self.per_hour:+{spec}} [{self.low:+{spec}}, {self.high:+{spec}}]"

    def short(self) -> str:
        if self.per_hour is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.per_hour:+.2g} ±n/a"
        return f"{self.per_hour:+.2g} ±{(self.high - self.low) / 2:.2g}"


class LeakVerdict(BaseModel):
    method: str = METHOD
    span_from_s: float  # seconds after the window's work started
    span_to_s: float
    samples: int
    interval_s: float
    slopes: list[LeakSlope]
    left: dict[str, float | None]  # after the window's teardown minus before it
    passed: bool | None  # None: nothing could be judged
    detail: str

    @property
    def leaking(self) -> list[LeakSlope]:
        return [s for s in self.slopes if s.leaks]


def slope_interval(t_h: Sequence[float], y: Sequence[float],
                   conf: float = CONFIDENCE) -> tuple[float | None, float | None, float | None, float | None]:
    """(slope, low, high, n_effective) of ``y`` on ``t_h`` (hours): least squares, with the slope's
    t-interval for the lag-1 autocorrelation of the residuals. low/high are None below MIN_EFFECTIVE."""
    n = len(y)
    if n < 3 or n != len(t_h):
        return None, None, None, None
    mt, my = sum(t_h) / n, sum(y) / n
    sxx = sum((t - mt) ** 2 for t in t_h)
    if sxx <= 0:
        return None, None, None, None
    b = sum((t - mt) * (v - my) for t, v in zip(t_h, y, strict=True)) / sxx
    a = my - b * mt
    res = [v - (a + b * t) for t, v in zip(t_h, y, strict=True)]
    ssr = sum(r * r for r in res)
    if ssr <= 1e-12 * max(1.0, sum(v * v for v in y)):
        return b, b, b, float(n)  # an exact line (a constant included): no uncertainty left
    den = sum(r * r for r in res)
    r1 = sum(res[i] * res[i - 1] for i in range(1, n)) / den if den > 0 else 0.0
    n_eff = n * (1 - r1) / (1 + r1) if r1 > 0 else float(n)
    n_eff = min(float(n), n_eff)
    if n_eff < MIN_EFFECTIVE:
        return b, None, None, n_eff
    se = math.sqrt(ssr / (n - 2) / sxx) * math.sqrt((n - 2) / (n_eff - 2))
    from scipy.special import stdtrit  # the t quantile, without scipy.stats's start-up cost

    half = float(stdtrit(n_eff - 2, 0.5 + conf / 2)) * se
    return b, b - half, b + half, n_eff


def verdict_word(passed: bool | None) -> str:
    """The one word a report shows for a leak verdict (terminal and HTML alike)."""
    return {None: "not judged", True: "none seen", False: "LEAKING"}[passed]


def steps(y: Sequence[float]) -> tuple[int, int]:
    """(rises, falls): the changes between consecutive values of ``y`` (equal values: no change)."""
    return (sum(1 for a, b in itertools.pairwise(y) if b > a), sum(1 for a, b in itertools.pairwise(y) if b < a))


def ramp_end(work_started: float, planned_s: float | None, t_ends: Sequence[float], concurrency: int) -> float:
    """When the window's ramp-up is over: the later of RAMP_FRACTION of the planned length and the
    end of its N-th attempt (every slot has been through one)."""
    start = work_started + RAMP_FRACTION * (planned_s or 0.0)
    ends = sorted(t for t in t_ends if t >= work_started)
    if ends:
        start = max(start, ends[min(max(1, concurrency), len(ends)) - 1])
    return start


def judge(samples: LeakSamplesArtifact, work_started: float, span_to: float, span_from: float) -> LeakVerdict:
    """The leak verdict of one window from its samples, fitted over [span_from, span_to] (wall clock)."""
    cols = samples.columns
    rows = [r for r in samples.rows if r[0] is not None and span_from <= float(r[0]) <= span_to]
    slopes = []
    series = {}
    for q in QUANTITIES:
        if q.key in cols:
            i = cols.index(q.key)
            series[q.key] = [(float(r[0] or 0.0), float(v)) for r in rows if (v := r[i]) is not None]
    measured = sum(1 for pts in series.values() if len(pts) >= 3)
    conf = 1.0 - FAMILY_ALPHA / max(1, measured)  # one verdict over every quantity: Bonferroni
    for q in QUANTITIES:
        if q.key not in series:
            continue
        pts = series[q.key]
        t_h = [(t - span_from) / 3600 for t, _ in pts]
        y = [v for _, v in pts]
        b, lo, hi, n_eff = slope_interval(t_h, y, conf)
        rises, falls = steps(y)
        span_h = (t_h[-1] - t_h[0]) if len(t_h) >= 2 else 0.0
        leaks = None if lo is None else bool(lo > max(0.0, q.tolerance_per_h)
                                             and (not q.counted or lo * span_h >= 1.0))
        if rises >= MIN_RISES and falls == 0 and span_h > 0 and (y[-1] - y[0]) / span_h > max(0.0, q.tolerance_per_h):
            leaks = True  # a staircase: its steps say what its autocorrelated residuals cannot
        label = q.label
        if q.key == "mounts" and samples.mounts_of_run is None:
            label = HOST_MOUNTS_LABEL  # counted by a sampler that did not know the run: the whole table
        slopes.append(LeakSlope(key=q.key, label=label, unit=q.unit, samples=len(y),
                                first=y[0] if y else None, last=y[-1] if y else None, per_hour=b, low=lo, high=hi,
                                n_effective=n_eff, tolerance_per_h=q.tolerance_per_h, leaks=leaks,
                                rises=rises, falls=falls))
    judged = [s for s in slopes if s.leaks is not None]
    bad = [s for s in judged if s.leaks]
    if not judged:
        passed, detail = None, f"not judged: {len(rows)} samples in the fitted span are too few"
    elif bad:
        passed = False
        detail = "LEAKS: " + "; ".join(f"{s.label} {s.fmt()} {s.unit}/h > tolerance {s.tolerance_per_h:g}"
                                       + (f" (rose {s.rises} times, never fell)"
                                          if (s.rises or 0) >= MIN_RISES and s.falls == 0 else "")
                                       for s in bad)
    else:
        passed = True
        unjudged = [s.key for s in slopes if s.leaks is None]
        detail = (f"no slope clearly above its tolerance ({len(judged)} quantities, {len(rows)} samples over "
                  f"{span_to - span_from:.0f} s)" + (f"; not judged: {', '.join(unjudged)}" if unjudged else ""))
    left = {k: (None if samples.after.get(k) is None or samples.before.get(k) is None
                else float(samples.after[k] or 0.0) - float(samples.before[k] or 0.0))
            for k in cols[1:]}
    return LeakVerdict(span_from_s=span_from - work_started, span_to_s=span_to - work_started, samples=len(rows),
                       interval_s=samples.interval_s, slopes=slopes, left=left, passed=passed, detail=detail)


def judge_watched(samples: dict[str, LeakSamplesArtifact], prefix: str) -> dict[str, LeakVerdict]:
    """The leak verdicts of a watched plain run (``run --watch``): one per segment artifact named
    ``prefix + N``, fitted from the end of its ramp-up (``RAMP_FRACTION`` of what was sampled) to its
    last sample. A plain run has no confirmation to fail; the verdict is reported beside its figures."""
    out: dict[str, LeakVerdict] = {}
    for name, s in sorted(samples.items()):
        times = [float(r[0]) for r in s.rows if r and r[0] is not None]
        if not name.startswith(prefix) or not times:
            continue
        start, end = times[0], times[-1]
        out[name] = judge(s, start, span_to=end, span_from=start + RAMP_FRACTION * (end - start))
    return out
