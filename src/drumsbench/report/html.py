"""One self-contained, offline HTML report of one or more runs, built from the ledger alone.

``build_html(ledger, run_ids)`` returns the page; ``write_html(ledger, run_ids, path)`` writes it.
The page has inline CSS and inline SVG plots (``report/svg.py``): no script, no font, no image and
no stylesheet is fetched from anywhere; screenshots are embedded as ``data:`` URIs. Several runs are
shown side by side: tables get one column per run, plots one colour per run (and substrate).

Sections (docs/html-report.md lists the artifact kinds and shapes each one reads):
- headline per run; outcomes (success, failed, every invalid cause on its own line);
- valid rollouts per host-hour and USD per valid rollout per price input, with intervals;
  completions over time;
- cold start and phase latency per substrate (CDFs and a percentile table);
- the sweep (throughput and invalid rate against N, confirmed windows, N_max) and the soak;
- branch results per fork method; the worker-hour projection; screenshots;
- per task; positive controls; machine, commit, configuration and price inputs.
A section whose data no run has is left out; a section that fails to render says so in place and
the rest of the page is still written.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from drumsbench.errors import UsageError
from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import (
    WHOLE_RUN,
    BranchMethodArtifact,
    PriceArtifact,
    RunArtifacts,
    ScreenshotArtifact,
    load_run,
    stored_price_files,
)
from drumsbench.measure.cost import PriceFile
from drumsbench.measure.stats import Estimate, inverse, quantile
from drumsbench.measure.summary import PHASES, RunReport, _offsets, build, columns
from drumsbench.outcome import InvalidCause
from drumsbench.report import svg
from drumsbench.report.svg import RangeRow, Rule, Series

# the artifact kinds behind each section (an unreadable one is reported in its section)
SECTION_KINDS = {"cost": ("price", "prices"), "coldstart": ("coldstart",), "isolation": ("isolation",),
                 "sweep": ("window", "sweep", "segment"), "branch": ("branch", "branch-summary"),
                 "projection": ("projection",), "screenshots": ("screenshot",), "training": ("train-summary",)}
FAITHFUL_DIMS = ("pixels", "text", "cursor", "selection", "undo", "modified", "dialogs", "locks")
MAX_SCREENSHOTS = 60  # per run
CDF_POINTS = 200


# -- data of one run ---------------------------------------------------------------------------------

@dataclass
class RunData:
    report: RunReport
    run: dict[str, Any]
    index: int
    label: str
    samples: dict[str, dict[str, np.ndarray]]  # substrate -> phase -> seconds
    timeline: tuple[np.ndarray, np.ndarray]  # offsets (s) on the run's host timeline: valid, invalid
    window_times: dict[str, tuple[np.ndarray, np.ndarray, float]]  # window -> (t_end valid, t_end invalid, t0)
    art: RunArtifacts
    prices: list[PriceArtifact] = field(default_factory=list)  # priced hosts (computed, never stored here)

    @property
    def has_attempts(self) -> bool:
        return self.report.attempts > 0


def _load(ledger: Ledger, run_id: str, index: int, report: RunReport | None,
          price_files: Sequence[PriceFile] = ()) -> RunData:
    c = columns(ledger, run_id)  # one pass over the attempts, shared with the run report
    rep = report or build(ledger, run_id, cols=c)
    run = ledger.run(run_id)
    total = c.t_end - c.t_start
    # phase samples per substrate (same inclusion rules as the run report: zero = phase not run)
    samples: dict[str, dict[str, np.ndarray]] = {}
    for sub in dict.fromkeys(c.substrate.tolist()):
        m = c.substrate == sub
        p, v, td = c.provision[m], c.verify[m], c.teardown[m]
        samples[sub] = {"provision": p[p != 0], "reset": c.reset[m], "step": c.steps.get(sub, np.empty(0)),
                        "verify": v[v != 0], "teardown": td[td != 0], "attempt": total[m]}
    offs = _offsets(ledger.segments(run_id), c.t_end)
    timeline = (offs[c.ok], offs[~c.ok])
    art = load_run(ledger, run_id)
    window_times: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for name in art.windows:
        m = c.window == name
        if m.any():
            window_times[name] = (c.t_end[m & c.ok], c.t_end[m & ~c.ok], float(c.t_start[m].min()))
    rd = RunData(rep, run, index, run_id, samples, timeline, window_times, art)
    rd.prices = _priced(rd, list(price_files) or stored_price_files(ledger, run_id))
    return rd


def _priced(rd: RunData, files: Sequence[PriceFile]) -> list[PriceArtifact]:
    """The run's priced hosts: the sweep's own figures (from confirmed windows) when it stored them,
    else each host of the price files (or the run's configured price) over the headline's basis."""
    if rd.art.prices and not files:
        return list(rd.art.prices.values())
    thr, basis = throughput_basis(rd)
    hours = rd.report.host_seconds / 3600
    hosts = [h for f in files for h in f.hosts()] or [rd.report.price]
    out = []
    for h in hosts:
        billed = h.usd_per_host_hour * h.billed_hours(hours) / hours if hours > 0 else h.usd_per_host_hour
        out.append(PriceArtifact(
            kind=h.kind, usd_per_host_hour=h.usd_per_host_hour,
            billed_usd_per_host_hour=billed if h.billed_hours(hours) > hours else None,
            usd_per_valid_rollout=inverse(thr, h.usd_per_host_hour) if thr is not None else None, basis=basis,
            name=h.name, note=h.note, inputs={"minimum_billed_hours": h.minimum_billed_hours}))
    return out


# -- small helpers ---------------------------------------------------------------------------------

class Raw(str):
    """HTML that is already escaped."""


class Keyed:
    """A table cell with a stable ``data-key`` (what the page tests compare against the JSON)."""

    def __init__(self, key: str, content: object) -> None:
        self.key, self.content = key, content


def _h(x: object) -> str:
    return x if isinstance(x, Raw) else escape(str(x))


def _g(v: float | None, spec: str = ".3g") -> str:
    """``format(v, spec)``, but 1,000 <= |v| < 1e9 is written in full (54,650, not 5.465e+04)."""
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    out = f"{v:{spec}}"
    if "e+" in out and abs(v) < 1e9:
        return f"{v:,.0f}"
    return out


def fmt_est(e: Estimate | None, spec: str = ".3g", factor: float = 1.0, unit: str = "") -> Raw:
    if e is None or e.value is None:
        return Raw('<span class="na">n/a</span>')
    u = f" {unit}" if unit else ""
    v = _g(e.value * factor, spec)
    if e.low is None or e.high is None:
        return Raw(f"{escape(v)}{escape(u)}")
    lo, hi = _g(e.low * factor, spec), _g(e.high * factor, spec)
    return Raw(f'{escape(v)}{escape(u)} <span class="ci" title="95% interval, {escape(e.method)}, n={e.n}">'
               f'[{escape(lo)}, {escape(hi)}]</span>')


def table(head: Sequence[object], rows: Iterable[Sequence[object]], cls: str = "", row_cls: Sequence[str] = (),
          left: int | set[int] = 1) -> str:
    """A table; text columns (the first ``left``, or those in the set) align left, numbers right in ``num``."""
    def is_left(j: int) -> bool:
        return j < left if isinstance(left, int) else j in left

    th = "".join(f'<th class="{"l" if is_left(i) else "r"}">{_h(c)}</th>' for i, c in enumerate(head))
    out = [f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>']
    for i, r in enumerate(rows):
        rc = f' class="{row_cls[i]}"' if i < len(row_cls) and row_cls[i] else ""
        out.append(f"<tr{rc}>" + "".join(_td(c, is_left(j)) for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _td(c: object, left: bool) -> str:
    cls = " class=l" if left else ""
    if isinstance(c, Keyed):
        return f'<td{cls} data-key="{escape(c.key)}">{_h(c.content)}</td>'
    return f"<td{cls}>{_h(c)}</td>"


def _pct(k: int, n: int) -> str:
    return f"{k / n * 100:.2f}%" if n else "–"


def _plots(*items: str) -> str:
    """Plots in a wrapping row, each captioned with its title (the SVG's aria-label)."""
    out = []
    for p in items:
        if not p:
            continue
        m = re.search(r'aria-label="([^"]*)"', p)
        cap = f'<div class="cap">{m.group(1)}</div>' if m else ""
        out.append(f'<div class="pl">{cap}{p}</div>')
    return '<div class="plots">' + "".join(out) + "</div>"


class Palette:
    """A stable colour per key (run, or run and substrate) across every plot of the page."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def __call__(self, key: str) -> str:
        if key not in self.keys:
            self.keys[key] = svg.color(len(self.keys))
        return self.keys[key]


def _skey(rd: RunData, sub: str) -> str:
    """Colour key of a (run, substrate): the run's own colour when the run used one substrate."""
    subs = set(rd.samples) | {a.substrate for a in rd.art.coldstart.values()} | \
        {a.substrate for a in rd.art.projection.values()}
    return rd.label if len(subs) <= 1 else f"{rd.label}/{sub}"


def _name(rd: RunData, runs: Sequence[RunData], what: str = "") -> str:
    if len(runs) == 1:
        return what or rd.label
    return f"{rd.label} · {what}" if what else rd.label


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(values)
    if len(x) <= CDF_POINTS:
        return x, np.arange(1, len(x) + 1) / len(x)
    p = np.linspace(0, 1, CDF_POINTS + 1)
    return np.quantile(x, p), p


def _bins(times: np.ndarray, span: float, nbins: int = 40) -> tuple[np.ndarray, np.ndarray, float]:
    nbins = max(1, min(nbins, int(span) if span >= 1 else 1))
    counts = np.histogram(np.clip(times, 0, span), bins=nbins, range=(0, span))[0] if span > 0 else np.zeros(1)
    width = span / nbins if span > 0 else 1.0
    centres = (np.arange(nbins) + 0.5) * width
    return centres, counts, width


# -- sections --------------------------------------------------------------------------------------

def sec_headline(runs: Sequence[RunData], pal: Palette) -> str:
    cards = []
    for rd in runs:
        r = rd.report
        head = (f'<div class="card" style="border-top-color:{pal(rd.label)}"><div class="rid">{escape(rd.label)}</div>'
                f'<div class="sub">{escape(r.kind)}, {escape(r.status)} · '
                f'{escape(str(r.config.get("substrate", r.config.get("substrates", "?"))))} · {r.attempts:,} attempts'
                f'</div>')
        if not rd.has_attempts:
            cards.append(head + f'<div class="lbl">a {escape(r.kind)} run records no rollouts: its figures are in '
                                f'the sections below</div></div>')
            continue
        thr, basis = throughput_basis(rd)
        price = rd.prices[0] if rd.prices else None
        k = escape(rd.label)
        if thr is None or price is None:
            money = (f'<div class="big na" data-key="{k}/headline/usd">no headline</div>'
                     f'<div class="lbl">{escape(basis)}</div>')
        else:
            usd = inverse(thr, price.usd_per_host_hour)
            money = (f'<div class="big" data-key="{k}/headline/usd">USD {fmt_est(usd, ".3g")}</div>'
                     f'<div class="lbl">per valid rollout — <b data-key="{k}/headline/basis">{escape(basis)}</b> '
                     f'({escape(price.name)}: USD {price.usd_per_host_hour:g}/host-hour; host cost only, inference '
                     f'excluded)</div><div class="mid" data-key="{k}/headline/valid_per_host_hour">'
                     f'{fmt_est(thr, ".4g")}</div>'
                     f'<div class="lbl">valid rollouts per host-hour — {escape(basis)}</div>')
        iso = ("fired" if r.isolation_confirmed else "DID NOT FIRE — isolation unconfirmed") if r.controls \
            else "not run — isolation unconfirmed"
        iso_cls = "ok" if r.isolation_confirmed else "bad"
        cards.append(
            head + money +
            f'<div class="mid">{fmt_est(r.invalid_rate, ".2%")}</div><div class="lbl">invalid rate '
            f'({r.invalid_total:,} of {r.attempts:,})</div>'
            f'<div class="ctl {iso_cls}">isolation positive control: {escape(iso)}</div></div>')
    return '<div class="cards">' + "".join(cards) + "</div>"


def sec_outcomes(runs: Sequence[RunData], pal: Palette) -> str | None:
    runs = [rd for rd in runs if rd.has_attempts]
    if not runs:
        return None
    head = ["outcome"] + [rd.label for rd in runs]
    rows: list[list[object]] = []
    cls: list[str] = []

    def add(name: str, vals: list[object], c: str = "") -> None:
        rows.append([name, *vals])
        cls.append(c)

    reps = [rd.report for rd in runs]
    add("attempts", [f"{r.attempts:,}" for r in reps], "tot")
    add("valid (success + failed)", [f"{r.valid:,} ({_pct(r.valid, r.attempts)})" for r in reps], "tot")
    add("valid-success (reward 1)", [f"{r.success:,} ({_pct(r.success, r.attempts)})" for r in reps], "ok")
    add("valid-failed (reward 0)", [f"{r.failed:,} ({_pct(r.failed, r.attempts)})" for r in reps], "")
    add("invalid (no reward, never scored 0)", [f"{r.invalid_total:,} ({_pct(r.invalid_total, r.attempts)})"
                                               for r in reps], "bad tot")
    for cause in InvalidCause:
        vals: list[object] = []
        for r in reps:
            k = r.invalid[cause.value]
            inj = r.injected[cause.value]
            caught = r.injected_caught[cause.value]
            note = f' <span class="note">{inj:,} injected, {caught:,} caught</span>' if inj else ""
            vals.append(Raw(f"{k:,} ({_pct(k, r.attempts)}){note}"))
        add(f"invalid: {cause.value}", vals, "cause")
    add("invalid, not injected (real faults)", [f"{r.invalid_not_injected:,}" for r in reps], "")
    add("success rate over valid", [fmt_est(r.success_rate, ".3f") for r in reps], "")
    add("invalid rate", [fmt_est(r.invalid_rate, ".3%") for r in reps], "")
    t = table(head, rows, "num outcomes", cls)
    bars = []
    inv_colors = ["#b2182b", "#d6604d", "#f4a582", "#e08214", "#8073ac", "#542788", "#c51b7d", "#7f3b08", "#40004b"]
    for rd in runs:
        r = rd.report
        parts = [("valid-success", r.success, "#1a9850"), ("valid-failed", r.failed, "#91bfdb")]
        parts += [(f"invalid: {c}", r.invalid[c], inv_colors[i % len(inv_colors)])
                  for i, c in enumerate(r.invalid)]
        bars.append((rd.label, parts))
    plot = svg.stacked_bars(bars, title="outcomes: share of attempts", width=760)
    return t + _plots(plot)


def throughput_basis(rd: RunData) -> tuple[Estimate | None, str]:
    """Valid rollouts per host-hour for the headline, and what it was measured over.

    A sweep: its confirmed windows at N_max, or None (no headline) when no window was confirmed.
    Any other run: the whole run, labelled as such."""
    sweep = rd.art.sweep
    if sweep is not None:
        if sweep.n_max is None or sweep.valid_per_host_hour is None or not sweep.valid_per_host_hour.value:
            return None, "no confirmed window: no headline is claimed"
        return sweep.valid_per_host_hour, f"confirmed windows at N_max = {sweep.n_max}"
    return rd.report.valid_per_host_hour, WHOLE_RUN


def sec_cost(runs: Sequence[RunData], pal: Palette) -> str | None:
    runs = [rd for rd in runs if rd.has_attempts]
    if not runs:
        return None
    head = ["figure"] + [rd.label for rd in runs]
    basis = [throughput_basis(rd) for rd in runs]
    rows: list[list[object]] = [
        ["valid rollouts per host-hour", *[Keyed(f"{rd.label}/cost/valid_per_host_hour", fmt_est(e, ".4g"))
                                           for rd, (e, _) in zip(runs, basis, strict=True)]],
        ["measured over", *[Keyed(f"{rd.label}/cost/basis", b) for rd, (_, b) in zip(runs, basis, strict=True)]],
        ["whole run: valid rollouts per host-hour", *[fmt_est(rd.report.valid_per_host_hour, ".4g") for rd in runs]],
        ["host time", *[f"{rd.report.host_seconds:,.1f} s in {rd.report.segments} segment(s)" for rd in runs]],
    ]
    names: list[str] = []
    for rd in runs:
        for q in rd.prices:
            if q.name not in names:
                names.append(q.name)
    ranges: list[RangeRow] = []
    for name in names:
        row: list[object] = [f"USD per valid rollout — {name}"]
        billed_row: list[object] = [f"USD per valid rollout — {name}, billed"]
        any_billed = False
        for rd, (thr, _) in zip(runs, basis, strict=True):
            p = next((q for q in rd.prices if q.name == name), None)
            if p is None:
                row.append("–")
                billed_row.append("–")
                continue
            e = p.usd_per_valid_rollout
            row.append(Keyed(f"{rd.label}/cost/usd/{name}",
                             Raw(f'{fmt_est(e, ".3g")} <span class="note">USD {p.usd_per_host_hour:.4g}/host-hour'
                                 f'</span>')))
            if e is not None and e.value is not None:
                ranges.append(RangeRow(_name(rd, runs, name), e.value, e.low, e.high if e.high != math.inf else None,
                                       color=pal(rd.label)))
            if p.billed_usd_per_host_hour is not None and thr is not None:
                any_billed = True
                b = inverse(thr, p.billed_usd_per_host_hour)
                billed_row.append(Raw(f'{fmt_est(b, ".3g")} <span class="note">USD '
                                      f'{p.billed_usd_per_host_hour:.4g}/host-hour billed</span>'))
            else:
                billed_row.append("–")
        rows.append(row)
        if any_billed:
            rows.append(billed_row)
    rows.append(["inference", *["excluded: host cost only" for _ in runs]])
    out = table(head, rows, "num")
    plots = []
    if ranges:
        vals = [r.value for r in ranges if r.value]
        log = bool(vals) and max(vals) / max(min(vals), 1e-12) > 20
        plots.append(svg.range_plot(ranges, "USD per valid rollout (95% interval)", log_x=log,
                                    title="USD per valid rollout per price input", x_min=None if log else 0))
    for rd in runs:  # one small plot per run: runs of different lengths do not share a time axis
        span = rd.report.host_seconds
        if span <= 0:
            continue
        c, k, w = _bins(rd.timeline[0], span)
        x_scale, unit = (60.0, "min") if span > 600 else (1.0, "s")
        series = [Series("valid per host-hour", list(c / x_scale), list(k / w * 3600), color=pal(rd.label),
                         mode="lines+markers" if len(c) < 15 else "lines")]
        ci, ki, wi = _bins(rd.timeline[1], span)
        if ki.sum():
            series.append(Series("invalid per host-hour", list(ci / x_scale), list(ki / wi * 3600),
                                 color=pal(rd.label), dash=True))
        title = "completions over time" + (f" — {rd.label}" if len(runs) > 1 else "")
        plots.append(svg.xy_plot(series, f"host time into the run ({unit}; dead time removed)", "per host-hour",
                                 y_min=0, title=title, width=460 if len(runs) > 1 else 560))
    return out + _plots(*plots)


def _ms(x: Estimate) -> Raw:
    return fmt_est(x, ".3g", 1000)


def sec_latency(runs: Sequence[RunData], pal: Palette) -> str | None:
    plots = []
    cold_series = []
    for rd in runs:
        for a in rd.art.coldstart.values():
            vals = np.asarray(a.first_command.samples_s, dtype=float)
            if len(vals):
                x, p = _cdf(vals * 1000)
                sub = a.substrate
                cold_series.append(Series(_name(rd, runs, f"{sub} (cold-start experiment)"), list(x), list(p * 100),
                                          color=pal(_skey(rd, sub))))
    if cold_series:
        plots.append(_cdf_plot(cold_series, "cold start: create a sandbox and run its first command"))
    for phase in PHASES:
        series = []
        for rd in runs:
            for sub, ph in rd.samples.items():
                v = ph.get(phase)
                if v is None or not len(v):
                    continue
                x, p = _cdf(v * 1000)
                series.append(Series(_name(rd, runs, sub), list(x), list(p * 100), color=pal(_skey(rd, sub)),
                                     mode="lines+markers" if len(x) < 25 else "lines"))
        if series:
            what = {"provision": "provision (sandbox created for the attempt: cold start within runs)",
                    "reset": "reset (to the task's verified start)", "step": "one step (action applied, observed)",
                    "verify": "verify", "teardown": "teardown", "attempt": "whole attempt"}[phase]
            plots.append(_cdf_plot(series, what))
    if not plots:
        return None
    head = ["run", "substrate", "phase", "n", "p50 ms", "p95 ms", "p99 ms"]
    rows: list[list[object]] = []
    for rd in runs:
        for sub, ph in rd.samples.items():
            for phase in PHASES:
                v = ph.get(phase)
                if v is None or not len(v):
                    continue
                xs = np.sort(v)
                rows.append([rd.label, sub, phase, f"{len(xs):,}", *[_ms(quantile(xs, q)) for q in (0.5, 0.95, 0.99)]])
        for a in rd.art.coldstart.values():
            vals = np.sort(np.asarray(a.first_command.samples_s, dtype=float))
            if len(vals):
                rows.append([rd.label, a.substrate, "cold start (experiment)", f"{len(vals):,}",
                             *[_ms(quantile(vals, q)) for q in (0.5, 0.95, 0.99)]])
    return _plots(*plots) + '<p class="note">Percentiles with order-statistics 95% intervals.</p>' + \
        table(head, rows, "num small", left=3)


def sec_coldstart(runs: Sequence[RunData], pal: Palette) -> str | None:
    """The cold-start experiment per substrate: first command, raw floor, teardown, idle memory, resets."""
    items = [(rd, a) for rd in runs for a in rd.art.coldstart.values()]
    if not items:
        return None
    head = ["run", "substrate", "isolation", "mode", "n", "first command p50 ms", "p95 ms", "raw floor p50 ms",
            "ratio to floor", "teardown p50 ms", "idle MiB", "reset in place p50 ms", "reset recreate p50 ms",
            "success"]
    rows: list[list[object]] = []
    resets: list[RangeRow] = []
    for rd, a in items:
        key = f"{rd.label}/coldstart/{a.substrate}"
        rows.append([rd.label, a.substrate, a.isolation, a.mode, f"{a.first_command.n:,}",
                     Keyed(f"{key}/first_command_p50_ms", _ms(a.first_command.p50)), _ms(a.first_command.p95),
                     Keyed(f"{key}/floor_p50_ms", _ms(a.floor.p50) if a.floor else "n/a"),
                     "n/a" if a.ratio_to_floor is None else f"{a.ratio_to_floor:.2f}",
                     _ms(a.teardown.p50), "n/a" if a.idle_memory_mib is None else f"{a.idle_memory_mib:.1f}",
                     Keyed(f"{key}/reset_in_place_p50_ms",
                           _ms(a.reset["in_place"].p50) if "in_place" in a.reset else "n/a"),
                     Keyed(f"{key}/reset_recreate_p50_ms",
                           _ms(a.reset["recreate"].p50) if "recreate" in a.reset else "n/a"),
                     fmt_est(a.success, ".3f")])
        for strategy, lat in a.reset.items():
            q = np.quantile(lat.samples_s, [0.05, 0.25, 0.5, 0.75, 0.95]) * 1000 if lat.samples_s else None
            if q is not None:
                resets.append(RangeRow(_name(rd, runs, f"{a.substrate} {strategy}"), q[2], q[0], q[4], q[1], q[3],
                                       color=pal(_skey(rd, a.substrate))))
    plots = []
    floors = [Series(_name(rd, runs, f"{a.substrate} raw floor"), *_xy_cdf(a.floor.samples_s),
                     color=pal(_skey(rd, a.substrate)), dash=True) for rd, a in items if a.floor and a.floor.samples_s]
    firsts = [Series(_name(rd, runs, f"{a.substrate} create -> first command"), *_xy_cdf(a.first_command.samples_s),
                     color=pal(_skey(rd, a.substrate))) for rd, a in items if a.first_command.samples_s]
    if firsts:
        plots.append(_cdf_plot(firsts + floors, "cold start beside each substrate's raw floor (dashed)"))
    if resets:
        plots.append(svg.range_plot(resets, "reset, ms (box: IQR, whiskers: p5–p95)",
                                    title="reset per strategy"))
    return _plots(*plots) + table(head, rows, "num small", left=4)


def _xy_cdf(samples_s: Sequence[float]) -> tuple[list[float], list[float]]:
    x, p = _cdf(np.asarray(samples_s, dtype=float) * 1000)
    return list(x), list(p * 100)


def sec_isolation(runs: Sequence[RunData], pal: Palette) -> str | None:
    """Escape probes per substrate: ran, contained, and the positive control behind each verdict."""
    items = [(rd, a) for rd in runs for a in rd.art.isolation.values()]
    if not items:
        return None
    rows: list[list[object]] = []
    for rd, a in items:
        for p in a.probes:
            cls = "ok" if p.verdict == "contained" else "bad" if p.verdict == "NOT contained" else "na"
            rows.append([rd.label, f"{a.substrate} ({a.declared})", p.probe,
                         Keyed(f"{rd.label}/isolation/{a.substrate}/{p.probe}",
                               Raw(f'<b class="{cls}">{escape(p.verdict)}</b>')),
                         "yes" if p.ran else "no", p.control, p.detail])
        rows.append([rd.label, f"{a.substrate} ({a.declared})", "canary positive control",
                     Keyed(f"{rd.label}/isolation/{a.substrate}/canary",
                           Raw('<b class="ok">fired</b>' if a.canary_control_fired else
                               '<b class="bad">DID NOT FIRE</b>')), "yes", "", ""])
    return ('<p class="note">"contained" needs a positive control that fired (the same probe where nothing '
            'isolates); otherwise "unconfirmed".</p>' +
            table(["run", "substrate", "probe", "verdict", "ran", "control", "detail"], rows, "small", left=7))


def _cdf_plot(series: list[Series], title: str) -> str:
    xs = [v for s in series for v in s.x if v is not None and v > 0]
    log = bool(xs) and max(xs) / max(min(xs), 1e-9) > 20
    return svg.xy_plot(series, "milliseconds" + (" (log scale)" if log else ""), "% of samples ≤ x", title=title,
                       log_x=log, y_min=0, y_max=100, width=520, height=260)


def sec_sweep(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.art.windows for rd in runs):
        return None
    thr_series: list[Series] = []
    inv_series: list[Series] = []
    soak_series: list[Series] = []
    rules_thr: list[Rule] = []
    rules_inv: list[Rule] = []
    soak_scale: float | None = None  # one time unit for every soak shown
    rows: list[list[object]] = []
    row_cls: list[str] = []
    for rd in runs:
        wins = rd.art.windows
        sweep = rd.art.sweep
        climb = sorted(((name, w) for name, w in wins.items() if w.role == "window"), key=lambda nw: nw[1].concurrency)
        col = pal(rd.label)
        if climb:
            ns: list[float | None] = []
            vals, lo, hi, inv, ilo, ihi = [], [], [], [], [], []
            hollow, tips = [], []
            for name, w in climb:
                e, ir = w.valid_per_host_hour, w.invalid_rate
                ns.append(w.concurrency)
                vals.append(e.value)
                lo.append(e.low)
                hi.append(e.high)
                hollow.append(not w.confirmed)
                tips.append(f"{name}: {_g(e.value, '.4g')} valid/host-hour"
                            f" — {'confirmed' if w.confirmed else 'NOT confirmed'}")
                inv.append(ir.value * 100 if ir.value is not None else None)
                ilo.append(ir.low * 100 if ir.low is not None else None)
                ihi.append(ir.high * 100 if ir.high is not None else None)
            thr_series.append(Series(_name(rd, runs, "valid per host-hour (filled = confirmed)"), ns, vals, color=col,
                                     mode="lines+markers", lo=lo, hi=hi, hollow=hollow, tips=tips))
            inv_series.append(Series(_name(rd, runs, "invalid rate"), ns, inv, color=col, mode="lines+markers",
                                     lo=ilo, hi=ihi, hollow=hollow))
            if sweep is not None and sweep.n_max:
                rules_thr.append(Rule(float(sweep.n_max), _name(rd, runs, f"N_max = {sweep.n_max}"), color=col))
            if sweep is not None and not rules_inv:
                rules_inv.append(Rule(sweep.invalid_threshold * 100, f"threshold {sweep.invalid_threshold * 100:g}%",
                                      axis="y", color="#b2182b"))
        for name, w in sorted(wins.items(), key=lambda nw: (nw[1].role != "window", nw[1].concurrency)):
            res = w.resources
            key = f"{rd.label}/window/{name}"
            rows.append([rd.label, name, w.role, w.concurrency,
                         f"{_g(w.ran_s, '.4g')} / {_g(w.planned_s, '.4g')} s",
                         Keyed(f"{key}/attempts", f"{w.attempts:,}"),
                         fmt_est(w.invalid_rate, ".2%"),
                         Keyed(f"{key}/valid_per_host_hour", fmt_est(w.valid_per_host_hour, ".4g")),
                         Keyed(f"{key}/confirmed", Raw('<b class="ok">confirmed</b>' if w.confirmed
                                                       else '<b class="bad">not confirmed</b>')),
                         Raw("<br>".join(escape(x) for x in w.reasons)),
                         ", ".join(f"{k} {_g(v, '.3g')}" for k, v in res.model_dump().items() if v is not None)])
            row_cls.append("" if w.confirmed else "dim")
        soak_name = sweep.soak if sweep is not None else None
        if soak_name and soak_name in rd.window_times and soak_name in wins:
            ok, bad, t0 = rd.window_times[soak_name]
            w = wins[soak_name]
            span = float(w.ran_s or (max(np.max(ok, initial=t0), np.max(bad, initial=t0)) - t0))
            if span > 0:
                c, k, width = _bins(ok - t0, span, 30)
                soak_scale = scale = soak_scale or (60.0 if span > 600 else 1.0)
                soak_series.append(Series(_name(rd, runs, f"{soak_name}: valid per host-hour"), list(c / scale),
                                          list(k / width * 3600), color=col, mode="lines+markers"))
                ref = w.valid_per_host_hour
                if ref.value:
                    soak_series.append(Series(_name(rd, runs, "soak mean"), [0, span / scale],
                                              [ref.value, ref.value], color=col, dash=True))
    plots = []
    if thr_series:
        plots.append(svg.xy_plot(thr_series, "concurrency N", "valid rollouts per host-hour", rules=rules_thr,
                                 y_min=0, x_integer=True, title="throughput against N (95% intervals)"))
        plots.append(svg.xy_plot(inv_series, "concurrency N", "invalid rate, %", rules=rules_inv, y_min=0,
                                 x_integer=True, title="invalid rate against N (Wilson intervals)"))
    if soak_series:
        unit = "min" if soak_scale == 60.0 else "s"
        plots.append(svg.xy_plot(soak_series, f"time into the soak ({unit})", "valid rollouts per host-hour",
                                 y_min=0, title="soak at N_max over time"))
    head = ["run", "window", "role", "N", "ran / planned", "attempts", "invalid rate", "valid per host-hour",
            "confirmed", "reasons", "host resources"]
    notes = []
    for rd in runs:
        sw = rd.art.sweep
        if sw is not None:
            n_max = "none (no window confirmed)" if sw.n_max is None else str(sw.n_max)
            notes.append(f'<li>{escape(rd.label)}: N_max = <b data-key="{escape(rd.label)}/sweep/n_max">'
                         f'{escape(n_max)}</b>' + (f"; {escape(sw.stopped)}" if sw.stopped else "")
                         + f"; {escape(sw.note)}</li>")
    return _plots(*plots) + (f"<ul>{''.join(notes)}</ul>" if notes else "") + \
        '<p class="note">Throughput is claimed only from confirmed windows; bursts are reported as bursts.</p>' + \
        table(head, rows, "num small", row_cls, left={0, 1, 2, 8, 9, 10})


def sec_branch(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.art.branch for rd in runs):
        return None
    dims: list[str] = [d for d in FAITHFUL_DIMS if any(d in b.faithful for rd in runs for b in rd.art.branch.values())]
    for rd in runs:
        for b in rd.art.branch.values():
            dims += [d for d in b.faithful if d not in dims]
    boxes: list[RangeRow] = []
    rows: list[list[object]] = []
    growth: list[Series] = []
    for rd in runs:
        items: list[tuple[str, BranchMethodArtifact]] = sorted(rd.art.branch.items(),
                                                               key=lambda kv: (kv[1].method, kv[1].k))
        for name, b in items:
            key = f"{rd.label}/branch/{name}"
            label = _name(rd, runs, f"{b.method}, k={b.k}")
            col = pal(f"method/{b.method}")
            cs = np.asarray(b.creation_sequential.samples_s, dtype=float)
            if len(cs):
                q = np.quantile(cs, [0.05, 0.25, 0.5, 0.75, 0.95]) * 1000
                boxes.append(RangeRow(label, q[2], q[0], q[4], q[1], q[3], color=col,
                                      tip=f"{label}: median {q[2]:.3g} ms, IQR {q[1]:.3g}–{q[3]:.3g}, "
                                          f"p5–p95 {q[0]:.3g}–{q[4]:.3g} ms, n={len(cs)}"))
            pts = sorted((int(k), e.value * 1000) for k, e in b.creation_by_k.items() if e.value is not None)
            if len(pts) > 1:
                growth.append(Series(_name(rd, runs, b.method), [float(k) for k, _ in pts], [v for _, v in pts],
                                     color=col, mode="lines+markers"))
            cells: list[object] = []
            for d in dims:
                sh = b.faithful.get(d)
                if sh is None:
                    cells.append("–")
                    continue
                w = sh.estimate
                tip = f"{sh.faithful} of {sh.total} faithful" + (
                    f", Wilson 95% [{w.low:.2f}, {w.high:.2f}]" if sh.total and w.low is not None and w.high is not None
                    else "")
                cells.append(Keyed(f"{key}/faithful/{d}",
                                   Raw(f'<span class="{"ok" if sh.complete else "bad"}" title="{escape(tip)}">'
                                       f'{sh.faithful}/{sh.total}</span>')))
            rows.append([rd.label, b.method, b.env, b.k, b.continuations,
                         Keyed(f"{key}/creation_p50_ms", _ms(b.creation_sequential.p50)),
                         Keyed(f"{key}/creation_p95_ms", _ms(b.creation_sequential.p95)),
                         Keyed(f"{key}/creation_parallel_p50_ms", _ms(b.creation_parallel.p50)), *cells,
                         Keyed(f"{key}/valid", f"{b.valid} of {b.continuations}"),
                         Keyed(f"{key}/valid_per_host_hour", fmt_est(b.valid_per_host_hour, ".4g")),
                         Keyed(f"{key}/usd_per_valid", fmt_est(b.usd_per_valid_continuation, ".3g"))])
    plots = []
    if boxes:
        vals = [v for r in boxes for v in (r.lo, r.hi) if v]
        log = bool(vals) and max(vals) / max(min(vals), 1e-9) > 20
        plots.append(svg.range_plot(boxes, "creation time per continuation, ms" + (" (log)" if log else ""),
                                    log_x=log, title="creation time per fork method (box: IQR, whiskers: p5–p95)"))
    if growth:
        plots.append(svg.xy_plot(growth, "k (steps before the fork)", "median creation, ms", log_y=True,
                                 title="creation time against k"))
    head = ["run", "method", "env", "k", "M", "creation p50 ms", "creation p95 ms", "all at once p50 ms",
            *[f"faithful: {d}" for d in dims], "valid", "valid per host-hour", "USD per valid continuation"]
    notes = []
    for rd in runs:
        bs = rd.art.branch_summary
        if bs is not None:
            notes.append(f"<li>{escape(rd.label)}: task {escape(bs.task)} on {escape(bs.substrate)}, k={bs.k}; the "
                         f"prepared state unchanged afterwards: <b data-key=\"{escape(rd.label)}/branch/unchanged\">"
                         f"{bs.prepared_unchanged}</b>; isolation positive control "
                         f"{'fired' if bs.isolation_control_fired else 'DID NOT FIRE'}</li>")
    return (_plots(*plots) + (f"<ul>{''.join(notes)}</ul>" if notes else "") +
            table(head, rows, "num small", left=3))


def sec_training(runs: Sequence[RunData], pal: Palette) -> str | None:
    """``drumsbench train``: learning curves per treatment (clean eval success, intervals over seeds),
    final eval per treatment, the paired differences with their tests, and the cost of each treatment."""
    items = [(rd, rd.art.train) for rd in runs if rd.art.train is not None]
    if not items:
        return None
    curves: list[Series] = []
    mass: list[Series] = []
    finals: list[list[object]] = []
    diffs: list[list[object]] = []
    costs: list[list[object]] = []
    for rd, t in items:
        assert t is not None
        for c in t.curves:
            col = pal(f"treatment/{c.treatment}")
            pts = c.points
            curves.append(Series(_name(rd, runs, c.treatment), [p.iteration for p in pts],
                                 [None if p.success.value is None else p.success.value * 100 for p in pts],
                                 color=col, mode="lines+markers",
                                 lo=[None if p.success.low is None else p.success.low * 100 for p in pts],
                                 hi=[None if p.success.high is None else p.success.high * 100 for p in pts]))
            mass.append(Series(_name(rd, runs, f"{c.treatment}: sabotage"), [p.iteration for p in pts],
                               [p.mass_sabotage * 100 for p in pts], color=col, dash=True))
        for f in t.finals:
            key = f"{rd.label}/train/{f.treatment}"
            finals.append([rd.label, f.treatment, Keyed(f"{key}/final_success", fmt_est(f.success, ".3f")),
                           fmt_est(f.pooled, ".3f"), f"{f.successes} of {f.valid}",
                           ", ".join("–" if v is None else f"{v:.2f}" for v in f.per_seed)])
        for d in t.comparisons:
            diffs.append([rd.label, f"{d.a} − {d.b}", Keyed(f"{rd.label}/train/{d.a}-{d.b}/difference",
                                                           fmt_est(d.difference, "+.3f")),
                          _g(d.p_paired_permutation, ".3g"), _g(d.p_fisher, ".3g"), d.note])
        for k in t.costs:
            costs.append([rd.label, k.treatment, f"{k.attempts:,}", f"{k.valid:,}", fmt_est(k.invalid_rate, ".2%"),
                          f"{k.retries:,}", Keyed(f"{rd.label}/train/{k.treatment}/invalid_in_loss",
                                                  f"{k.invalid_in_loss:,}"),
                          _g(k.host_s, ".4g"), _g(k.usd_per_valid_rollout, ".3g"),
                          f"{k.reached_90}" + (f" ({fmt_est(k.host_s_to_90, '.3g')} s)" if k.host_s_to_90 else "")])
    plots = [svg.xy_plot(curves, "iteration", "clean eval success, % (95% interval over seeds)", y_min=0, y_max=100,
                         x_integer=True, title="learning curves per treatment"),
             svg.xy_plot(mass, "iteration", "% of first-step probability on sabotage actions", y_min=0,
                         x_integer=True, title="probability mass on sabotage")]
    notes = "".join(f"<li>{escape(rd.label)}: {escape(t.conditions)}</li>" for rd, t in items if t is not None)
    return (_plots(*plots) + f"<ul>{notes}</ul>" +
            table(["run", "treatment", "final eval success (mean over seeds)", "pooled", "successes", "per seed"],
                  finals, "num small", left=2) +
            table(["run", "difference", "paired mean [95%]", "p (sign-flip)", "p (Fisher)", "note"], diffs,
                  "num small", left={0, 1, 5}) +
            table(["run", "treatment", "attempts", "valid", "invalid rate", "retries", "invalid in the loss",
                   "host s", "USD per valid rollout", "seeds reaching 90%"], costs, "num small", left=2))


def sec_projection(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.art.projection for rd in runs):
        return None
    rows: list[list[object]] = []
    bars: list[RangeRow] = []
    for rd in runs:
        for name, p in rd.art.projection.items():
            proj, meas = p.projected_s_per_trajectory, p.measured_s_per_trajectory
            diff = f"{(proj - meas) / meas:+.1%}" if proj is not None and meas else "–"
            wh = p.worker_hours
            rows.append([rd.label, p.substrate, f"{p.trajectories:,} × {p.steps} steps",
                         fmt_est(p.cold_start_s, ".3g"), fmt_est(p.reset_s, ".3g"),
                         fmt_est(p.per_step_s, ".3g"), fmt_est(p.verify_s, ".3g"),
                         _g(proj, ".4g"), _g(meas, ".4g"), diff,
                         Keyed(f"{rd.label}/projection/{name}/worker_hours", fmt_est(wh, ".4g"))])
            if wh.value is not None:
                bars.append(RangeRow(_name(rd, runs, p.substrate), wh.value, wh.low, wh.high,
                                     color=pal(_skey(rd, p.substrate))))
    head = ["run", "substrate", "workload", "cold start s", "reset s", "per step s", "verify s",
            "projected s / trajectory", "measured s / trajectory", "projected vs measured", "worker-hours"]
    plot = svg.range_plot(bars, "worker-hours", x_min=0, title="worker-hours per substrate") if bars else ""
    return ('<p class="note">worker-hours = (cold start + steps × per-step overhead + verify) × trajectories / '
            '3600</p>' + table(head, rows, "num small", left=3) + _plots(plot))


def _image(a: ScreenshotArtifact, base: Path | None) -> tuple[str, bytes] | None:
    data: bytes | None = None
    if a.png_base64:
        try:
            data = base64.b64decode(a.png_base64, validate=True)
        except (binascii.Error, ValueError):
            return None
    elif a.path and base is not None:
        p = (base / a.path).resolve()
        if not p.is_relative_to(base.resolve()):
            return None  # a screenshot is read from the ledger's folder, nowhere else
        try:
            data = p.read_bytes()
        except OSError:
            return None
    if not data:
        return None
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png", data
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg", data
    return None  # only raster images are embedded: nothing that could reference another resource


def sec_screenshots(runs: Sequence[RunData], pal: Palette, base: Path | None) -> str | None:
    if not any(rd.art.screenshots for rd in runs):
        return None
    out = []
    for rd in runs:
        shots = rd.art.screenshots
        if not shots:
            continue
        by_task: dict[str, list[tuple[str, ScreenshotArtifact]]] = {}
        for name, a in shots.items():
            by_task.setdefault(a.task, []).append((name, a))
        shown = 0
        if len(runs) > 1:
            out.append(f"<h3>{escape(rd.label)}</h3>")
        for task, items in by_task.items():
            figs = []
            for name, a in items:
                if shown >= MAX_SCREENSHOTS:
                    break
                img = _image(a, base)
                cap = " · ".join(str(x) for x in (a.method, a.seq, a.stage, a.note) if x is not None) or name
                key = f"{rd.label}/screenshot/{name}"
                if img is None:
                    figs.append(f'<figure class="shot missing" data-key="{escape(key)}"><div>image not available</div>'
                                f'<figcaption>{escape(cap)}</figcaption></figure>')
                    continue
                mime, data = img
                style = f' style="max-width:{min(a.width, 480)}px"' if a.width else ' style="max-width:480px"'
                figs.append(f'<figure class="shot" data-key="{escape(key)}"><img alt="{escape(task)} {escape(cap)}"'
                            f'{style} src="data:{mime};base64,{base64.b64encode(data).decode()}">'
                            f'<figcaption>{escape(cap)}</figcaption></figure>')
                shown += 1
            out.append(f'<h4>{escape(task)}</h4><div class="shots">{"".join(figs)}</div>')
        if len(shots) > shown:
            out.append(f'<p class="note">{len(shots) - shown} more screenshot(s) in the ledger not shown.</p>')
    return "".join(out)


def sec_tasks(runs: Sequence[RunData], pal: Palette) -> str | None:
    names = sorted({t for rd in runs for t in rd.report.tasks})
    if not names:
        return None
    head = ["task"] + [rd.label for rd in runs]
    rows: list[list[object]] = []
    for t in names:
        row: list[object] = [t]
        for rd in runs:
            line = rd.report.tasks.get(t)
            row.append("–" if line is None else Raw(
                f'{line.attempts:,}: <span class="ok">{line.success:,} success</span>, {line.failed:,} failed, '
                f'<span class="{"bad" if line.invalid else ""}">{line.invalid:,} invalid</span>'))
        rows.append(row)
    return table(head, rows, "num small")


def sec_controls(runs: Sequence[RunData], pal: Palette) -> str:
    rows: list[list[object]] = []
    for rd in runs:
        if not rd.report.controls:
            rows.append([rd.label, "–", "isolation", Raw('<b class="bad">not run</b>'),
                         "no positive control ran: isolation unconfirmed"])
        for c in rd.report.controls:
            rows.append([rd.label, c.window or "(run)", c.kind,
                         Raw('<b class="ok">fired</b>' if c.fired else '<b class="bad">DID NOT FIRE</b>'), c.detail])
    summary = "".join(
        f'<li>{escape(rd.label)}: isolation '
        f'{"<b class=ok>confirmed</b>" if rd.report.isolation_confirmed else "<b class=bad>unconfirmed</b>"}</li>'
        for rd in runs)
    return f"<ul>{summary}</ul>" + table(["run", "window", "kind", "fired", "detail"], rows, "small")


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    out[prefix[:-1]] = json.dumps(d) if isinstance(d, (list, bool)) or d is None else str(d)
    return out


def sec_conditions(runs: Sequence[RunData], pal: Palette) -> str:
    flats = []
    for rd in runs:
        r, run = rd.report, rd.run
        f = {"run id": rd.label, "kind": r.kind, "status": r.status,
             "created (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.get("created", 0))),
             "commit": r.commit, "host time": f"{r.host_seconds:,.1f} s in {r.segments} segment(s)"}
        f.update(_flat(r.machine, "machine."))
        f.update(_flat(r.config, "config."))
        for p in rd.prices:
            f[f"price input: {p.name}"] = (f"USD {p.usd_per_host_hour:.4g}/host-hour"
                                           + (f" ({p.kind})" if p.kind else "") + (f" — {p.note}" if p.note else ""))
            if p.inputs:
                f[f"price input: {p.name}: inputs"] = json.dumps(p.inputs)
        if rd.art.other_kinds:
            f["other artifacts in the ledger"] = ", ".join(f"{k} ({n})" for k, n in sorted(rd.art.other_kinds.items()))
        for kind, why in rd.art.errors.items():
            f[f"unreadable artifacts: {kind}"] = why
        flats.append(f)
    keys: list[str] = []
    for f in flats:
        keys += [k for k in f if k not in keys]
    order = ("machine.", "config.", "price input", "other")
    keys.sort(key=lambda k: next((i + 1 for i, p in enumerate(order) if k.startswith(p)), 0))  # stable
    rows, cls = [], []
    for k in keys:
        vals = [f.get(k, "–") for f in flats]
        rows.append([k, *vals])
        differs = len(runs) > 1 and len(set(vals)) > 1 and k not in ("run id", "created (UTC)")
        cls.append("diff" if differs else "")
    note = '<p class="note">Rows that differ between the runs are highlighted.</p>' if len(runs) > 1 else ""
    return note + table(["", *[rd.label for rd in runs]], rows, "small kv", cls)


# -- page ------------------------------------------------------------------------------------------

CSS = """
:root{--fg:#1d232b;--mut:#5b6673;--line:#d8dde3;--bg:#fff;--soft:#f4f6f8;--ok:#1a7f37;--bad:#b42318}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{padding:18px 28px 10px;border-bottom:1px solid var(--line);background:var(--soft)}
h1{margin:0 0 4px;font-size:22px}
h2{font-size:18px;margin:30px 0 10px;padding-top:6px;border-top:2px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px} h4{font-size:13px;margin:12px 0 6px;color:var(--mut)}
main{padding:6px 28px 40px;max-width:1700px}
nav a{margin-right:12px;color:#1f5fbf;text-decoration:none;font-size:13px}
.meta{color:var(--mut);font-size:12.5px}
.cards{display:flex;flex-wrap:wrap;gap:14px;margin-top:14px}
.card{border:1px solid var(--line);border-top:5px solid #888;border-radius:6px;padding:10px 14px;min-width:300px;
flex:1 1 300px;max-width:560px;background:#fff}
.card .rid{font-weight:700;font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.card .sub,.card .lbl{color:var(--mut);font-size:12px}
.card .big{font-size:24px;font-weight:700;margin-top:6px}
.card .big .ci{display:block;font-size:13px;font-weight:600} .card .mid{font-size:17px;font-weight:600;margin-top:6px}
.ctl{margin-top:8px;font-weight:600}
.ok{color:var(--ok)} .bad{color:var(--bad)}
.ci{color:var(--mut);font-size:.9em} .na{color:var(--mut)} .note{color:var(--mut);font-size:12px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 10px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}
table.num td:not(.l),table.num th.r{text-align:right;font-variant-numeric:tabular-nums}
td.wrap{max-width:340px}
table.small{font-size:12px}
tr.tot td{font-weight:600} tr.cause td:first-child{padding-left:26px}
tr.dim td{color:#7a828c} tr.diff td{background:#fff7e0}
table.kv td:first-child{font-family:ui-monospace,"DejaVu Sans Mono",monospace;color:var(--mut)}
.plots{display:flex;flex-wrap:wrap;gap:16px;margin:8px 0}
.pl{flex:0 1 auto;max-width:100%} .pl .cap{font-size:12.5px;font-weight:600;margin:0 0 2px 8px;color:#333}
svg.plot{max-width:100%;height:auto;font-family:inherit}
svg.plot .bg{fill:#fff} svg.plot .area{fill:#fbfcfd;stroke:none}
svg.plot .grid{stroke:#e6e9ed;stroke-width:1} svg.plot .ax{stroke:#7a828c;stroke-width:1}
svg.plot text{font-size:11px;fill:#333} svg.plot .al{font-size:11.5px;fill:#222}
svg.plot .ln{fill:none;stroke-width:2} svg.plot .eb{fill:none;stroke-width:1.4}
svg.plot .mk{stroke-width:1.6} svg.plot .rule{stroke-dasharray:6 4;stroke-width:1.4}
svg.plot .box{fill-opacity:.35;stroke-width:1.2} svg.plot .lg{font-size:11px}
.shots{display:flex;flex-wrap:wrap;gap:12px}
figure.shot{margin:0;border:1px solid var(--line);padding:6px;background:var(--soft)}
figure.shot img{display:block;width:100%;image-rendering:auto}
figure.shot figcaption{font-size:12px;color:var(--mut);margin-top:4px}
figure.missing div{width:200px;height:120px;display:flex;align-items:center;justify-content:center;color:var(--mut)}
p.err{border:1px solid var(--bad);color:var(--bad);padding:8px;background:#fff4f2}
"""


def build_html(ledger: Ledger, run_ids: Sequence[str], reports: dict[str, RunReport] | None = None,
               screenshots_base: Path | None = None, price_files: Sequence[PriceFile] = ()) -> str:
    """The page for ``run_ids`` (side by side, in the order given). Reads the ledger, never writes it;
    ``price_files`` (``report --price``) price every run instead of the prices it stored."""
    if not run_ids:
        raise UsageError("report: give at least one run id")
    base = screenshots_base if screenshots_base is not None else ledger.path.parent
    runs = [_load(ledger, rid, i, (reports or {}).get(rid), price_files)
            for i, rid in enumerate(dict.fromkeys(run_ids))]
    pal = Palette()
    for rd in runs:
        pal(rd.label)
    sections: list[tuple[str, str, Callable[[], str | None]]] = [
        ("outcomes", "Outcomes", lambda: sec_outcomes(runs, pal)),
        ("cost", "Throughput and USD per valid rollout", lambda: sec_cost(runs, pal)),
        ("latency", "Cold start and phase latency per substrate", lambda: sec_latency(runs, pal)),
        ("coldstart", "Cold-start experiment: floors, teardown, memory, reset", lambda: sec_coldstart(runs, pal)),
        ("isolation", "Isolation: escape attempts", lambda: sec_isolation(runs, pal)),
        ("sweep", "Sweep: windows, N_max and soak", lambda: sec_sweep(runs, pal)),
        ("branch", "Branch from a prepared state", lambda: sec_branch(runs, pal)),
        ("projection", "Worker-hour projection", lambda: sec_projection(runs, pal)),
        ("training", "Training: does the handling of invalid attempts change what a policy learns?",
         lambda: sec_training(runs, pal)),
        ("screenshots", "Screenshots from the desktop environment and its branches",
         lambda: sec_screenshots(runs, pal, base)),
        ("tasks", "Per task", lambda: sec_tasks(runs, pal)),
        ("controls", "Positive controls", lambda: sec_controls(runs, pal)),
        ("conditions", "Machine, commit, configuration, price inputs", lambda: sec_conditions(runs, pal)),
    ]
    body, nav = [], []
    for sid, title, fn in sections:
        try:
            html = fn()
        except Exception as e:  # one broken section must not cost the rest of the report
            html = (f'<p class="err">This section could not be rendered: {escape(type(e).__name__)}: '
                    f'{escape(str(e))}</p>')
        broken = [f"{rd.label}: {why}" for rd in runs for kind, why in rd.art.errors.items()
                  if kind in SECTION_KINDS.get(sid, ())]
        if broken:  # artifacts that do not fit their model: said in place, the rest of the section stays
            html = "".join(f'<p class="err">Part of this section could not be rendered: {escape(b)}</p>'
                           for b in broken) + (html or "")
        if html is None:
            continue
        nav.append(f'<a href="#{sid}">{escape(title)}</a>')
        body.append(f'<section id="{sid}"><h2>{escape(title)}</h2>{html}</section>')
    try:
        headline = sec_headline(runs, pal)
    except Exception as e:
        headline = f'<p class="err">Headline could not be rendered: {escape(type(e).__name__)}: {escape(str(e))}</p>'
    title = "DrumsBench report — " + ", ".join(rd.label for rd in runs)
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        # the page may load nothing from anywhere: images only as data: URIs, styles inline, no scripts
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>DrumsBench report</h1><div class=\"meta\">{len(runs)} run(s) from {escape(str(ledger.path))}"
        f" · built from the ledger alone · generated {generated} · 95% intervals · headline is host cost only, "
        f"inference excluded</div><nav>{''.join(nav)}</nav>{headline}</header>"
        f"<main>{''.join(body)}</main></body></html>\n")


def write_html(ledger: Ledger, run_ids: Sequence[str], path: Path,
               reports: dict[str, RunReport] | None = None, price_files: Sequence[PriceFile] = ()) -> Path:
    page = build_html(ledger, run_ids, reports, price_files=price_files)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--html: cannot write {path} ({e.strerror}); choose a writable path") from None
    return path
