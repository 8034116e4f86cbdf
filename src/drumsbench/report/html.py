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
from drumsbench.measure.stats import Estimate, inverse, quantile, wilson
from drumsbench.measure.summary import PHASES, RunReport, _offsets, build, columns
from drumsbench.outcome import InvalidCause
from drumsbench.report import svg
from drumsbench.report.svg import RangeRow, Rule, Series

ARTIFACT_KINDS = ("window", "sweep", "price", "coldstart", "branch", "projection", "screenshot")
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
    artifacts: dict[str, dict[str, Any]]
    other_kinds: dict[str, int] = field(default_factory=dict)

    def kind(self, kind: str) -> dict[str, Any]:
        return self.artifacts.get(kind, {})


def _load(ledger: Ledger, run_id: str, index: int, report: RunReport | None) -> RunData:
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
    artifacts = {k: ledger.artifacts(run_id, k) for k in ARTIFACT_KINDS}
    window_times: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for name in artifacts.get("window", {}):
        m = c.window == name
        if m.any():
            window_times[name] = (c.t_end[m & c.ok], c.t_end[m & ~c.ok], float(c.t_start[m].min()))
    other = {r[0]: r[1] for r in ledger.db.execute(
        "SELECT kind, COUNT(*) FROM artifacts WHERE run_id = ? GROUP BY kind", (run_id,)) if r[0] not in ARTIFACT_KINDS}
    return RunData(rep, run, index, run_id, samples, timeline, window_times, artifacts, other)


# -- small helpers ---------------------------------------------------------------------------------

class Raw(str):
    """HTML that is already escaped."""


def _h(x: object) -> str:
    return x if isinstance(x, Raw) else escape(str(x))


def _est(x: Any) -> Estimate | None:
    """An Estimate from an artifact field: an Estimate object, a plain number or null."""
    if x is None:
        return None
    if isinstance(x, Estimate):
        return x
    if isinstance(x, (int, float)):
        return Estimate(value=float(x), low=None, high=None, n=0, method="given")
    if isinstance(x, dict) and "value" in x:
        return Estimate(value=x.get("value"), low=x.get("low"), high=x.get("high"), n=int(x.get("n") or 0),
                        method=str(x.get("method") or "given"))
    raise ValueError(f"not an estimate: {x!r}")


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
        out.append(f"<tr{rc}>" + "".join(f'<td{" class=l" if is_left(j) else ""}>{_h(c)}</td>'
                                         for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


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
    subs = set(rd.samples) | {str(a.get("substrate", n)) for n, a in rd.kind("coldstart").items()} | \
        {str(a.get("substrate", n)) for n, a in rd.kind("projection").items()}
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
        thr, basis = throughput_basis(rd)
        usd = inverse(thr, r.price.usd_per_host_hour) if thr.value else r.usd_per_valid_rollout
        iso = ("fired" if r.isolation_confirmed else "DID NOT FIRE — isolation unconfirmed") if r.controls \
            else "not run — isolation unconfirmed"
        iso_cls = "ok" if r.isolation_confirmed else "bad"
        cards.append(
            f'<div class="card" style="border-top-color:{pal(rd.label)}"><div class="rid">{escape(rd.label)}</div>'
            f'<div class="sub">{escape(r.kind)}, {escape(r.status)} · {escape(str(r.config.get("substrate", "?")))}'
            f' · {r.attempts:,} attempts</div>'
            f'<div class="big">USD {fmt_est(usd, ".3g")}</div><div class="lbl">per valid rollout '
            f'({escape(r.price.name)}: USD {r.price.usd_per_host_hour:g}/host-hour; host cost only, inference '
            f'excluded)</div>'
            f'<div class="mid">{fmt_est(thr, ".4g")}</div><div class="lbl">valid rollouts per host-hour — '
            f'{escape(basis)}</div>'
            f'<div class="mid">{fmt_est(r.invalid_rate, ".2%")}</div><div class="lbl">invalid rate '
            f'({r.invalid_total:,} of {r.attempts:,})</div>'
            f'<div class="ctl {iso_cls}">isolation positive control: {escape(iso)}</div></div>')
    return '<div class="cards">' + "".join(cards) + "</div>"


def sec_outcomes(runs: Sequence[RunData], pal: Palette) -> str:
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


def throughput_basis(rd: RunData) -> tuple[Estimate, str]:
    """Valid rollouts per host-hour for the headline, and what it was measured over.

    Confirmed windows at N_max (from the sweep's artifacts) when present; else the whole run."""
    sweep = rd.kind("sweep").get("summary") or {}
    wins = rd.kind("window")
    n_max = sweep.get("n_max")
    if n_max is None:
        confirmed = [w for w in wins.values() if w.get("confirmed") and w.get("role", "window") == "window"]
        n_max = max((w.get("concurrency", 0) for w in confirmed), default=None)
    if sweep.get("valid_per_host_hour") is not None:
        e = _est(sweep["valid_per_host_hour"])
        if e is not None and e.value:
            return e, f"confirmed windows at N_max = {n_max}"
    if n_max is not None:
        for w in wins.values():
            if w.get("concurrency") == n_max and w.get("confirmed") and w.get("role", "window") == "window":
                e = _est(w.get("valid_per_host_hour"))
                if e is not None and e.value:
                    return e, f"confirmed window at N_max = {n_max}"
    return rd.report.valid_per_host_hour, "whole run (not a confirmed window)"


def _prices(rd: RunData) -> list[dict[str, Any]]:
    r = rd.report
    out = [{"name": r.price.name, "kind": "run config", "usd_per_host_hour": r.price.usd_per_host_hour,
            "note": r.price.note}]
    for name, p in rd.kind("price").items():
        if name == r.price.name:
            continue
        out.append({"name": name, **p})
    return out


def sec_cost(runs: Sequence[RunData], pal: Palette) -> str:
    head = ["figure"] + [rd.label for rd in runs]
    basis = [throughput_basis(rd) for rd in runs]
    rows: list[list[object]] = [
        ["valid rollouts per host-hour", *[fmt_est(e, ".4g") for e, _ in basis]],
        ["measured over", *[b for _, b in basis]],
        ["whole run: valid rollouts per host-hour", *[fmt_est(rd.report.valid_per_host_hour, ".4g") for rd in runs]],
        ["host time", *[f"{rd.report.host_seconds:,.1f} s in {rd.report.segments} segment(s)" for rd in runs]],
    ]
    names: list[str] = []
    for rd in runs:
        for q in _prices(rd):
            if q["name"] not in names:
                names.append(q["name"])
    ranges: list[RangeRow] = []
    for name in names:
        row: list[object] = [f"USD per valid rollout — {name}"]
        billed_row: list[object] = [f"USD per valid rollout — {name}, billed"]
        any_billed = False
        for rd, (thr, _) in zip(runs, basis, strict=True):
            p: dict[str, Any] | None = next((q for q in _prices(rd) if q["name"] == name), None)
            if p is None:
                row.append("–")
                billed_row.append("–")
                continue
            e = _est(p["usd_per_valid_rollout"]) if "usd_per_valid_rollout" in p else \
                inverse(thr, float(p["usd_per_host_hour"]))
            row.append(Raw(f'{fmt_est(e, ".3g")} <span class="note">USD {float(p["usd_per_host_hour"]):.4g}/host-hour'
                           f'</span>'))
            if e is not None and e.value is not None:
                ranges.append(RangeRow(_name(rd, runs, name), e.value, e.low, e.high if e.high != math.inf else None,
                                       color=pal(rd.label)))
            if p.get("billed_usd_per_host_hour") is not None:
                any_billed = True
                b = inverse(thr, float(p["billed_usd_per_host_hour"]))
                billed_row.append(Raw(f'{fmt_est(b, ".3g")} <span class="note">USD '
                                      f'{float(p["billed_usd_per_host_hour"]):.4g}/host-hour billed</span>'))
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
        for name, a in rd.kind("coldstart").items():
            vals = np.asarray([v for v in a.get("samples_s", []) if v is not None], dtype=float)
            if len(vals):
                x, p = _cdf(vals * 1000)
                sub = str(a.get("substrate", name))
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
        for name, a in rd.kind("coldstart").items():
            vals = np.sort(np.asarray([v for v in a.get("samples_s", []) if v is not None], dtype=float))
            if len(vals):
                rows.append([rd.label, a.get("substrate", name), "cold start (experiment)", f"{len(vals):,}",
                             *[_ms(quantile(vals, q)) for q in (0.5, 0.95, 0.99)]])
    return _plots(*plots) + '<p class="note">Percentiles with order-statistics 95% intervals.</p>' + \
        table(head, rows, "num small", left=3)


def _cdf_plot(series: list[Series], title: str) -> str:
    xs = [v for s in series for v in s.x if v is not None and v > 0]
    log = bool(xs) and max(xs) / max(min(xs), 1e-9) > 20
    return svg.xy_plot(series, "milliseconds" + (" (log scale)" if log else ""), "% of samples ≤ x", title=title,
                       log_x=log, y_min=0, y_max=100, width=520, height=260)


def sec_sweep(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.kind("window") for rd in runs):
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
        wins = rd.kind("window")
        sweep = rd.kind("sweep").get("summary") or {}
        threshold = sweep.get("invalid_threshold")
        climb = sorted(((name, w) for name, w in wins.items() if w.get("role", "window") == "window"),
                       key=lambda nw: nw[1].get("concurrency", 0))
        col = pal(rd.label)
        if climb:
            ns, vals, lo, hi, hollow, tips, inv, ilo, ihi = [], [], [], [], [], [], [], [], []
            for name, w in climb:
                e = _est(w.get("valid_per_host_hour"))
                ir = _invalid_rate(w)
                ns.append(w.get("concurrency"))
                vals.append(e.value if e else None)
                lo.append(e.low if e else None)
                hi.append(e.high if e else None)
                hollow.append(not w.get("confirmed"))
                tips.append(f"{name}: {_g(e.value if e else None, '.4g')} valid/host-hour"
                            f" — {'confirmed' if w.get('confirmed') else 'NOT confirmed'}")
                inv.append(ir.value * 100 if ir and ir.value is not None else None)
                ilo.append(ir.low * 100 if ir and ir.low is not None else None)
                ihi.append(ir.high * 100 if ir and ir.high is not None else None)
            thr_series.append(Series(_name(rd, runs, "valid per host-hour (filled = confirmed)"), ns, vals, color=col,
                                     mode="lines+markers", lo=lo, hi=hi, hollow=hollow, tips=tips))
            inv_series.append(Series(_name(rd, runs, "invalid rate"), ns, inv, color=col, mode="lines+markers",
                                     lo=ilo, hi=ihi, hollow=hollow))
            n_max = sweep.get("n_max")
            if n_max is None:
                n_max = max((w.get("concurrency", 0) for _, w in climb if w.get("confirmed")), default=None)
            if n_max:
                rules_thr.append(Rule(float(n_max), _name(rd, runs, f"N_max = {n_max}"), color=col))
            if threshold is not None and not rules_inv:
                rules_inv.append(Rule(float(threshold) * 100, f"threshold {float(threshold) * 100:g}%", axis="y",
                                      color="#b2182b"))
        for name, w in sorted(wins.items(), key=lambda nw: (nw[1].get("role", "window") != "window",
                                                             nw[1].get("concurrency", 0))):
            e = _est(w.get("valid_per_host_hour"))
            ran = w.get("ran_s")
            planned = w.get("planned_s")
            res = w.get("resources") or {}
            rows.append([rd.label, name, w.get("role", "window"), w.get("concurrency", "?"),
                         f"{_g(ran, '.4g')} / {_g(planned, '.4g')} s", f"{w.get('attempts', 0):,}",
                         fmt_est(_invalid_rate(w), ".2%"), fmt_est(e, ".4g"),
                         Raw('<b class="ok">confirmed</b>' if w.get("confirmed")
                             else '<b class="bad">not confirmed</b>'),
                         Raw("<br>".join(escape(str(x)) for x in w.get("reasons", []))),
                         ", ".join(f"{k} {v}" for k, v in res.items())])
            row_cls.append("" if w.get("confirmed") else "dim")
        soak_name = sweep.get("soak") or next((n for n, w in wins.items() if w.get("role") == "soak"), None)
        if soak_name and soak_name in rd.window_times:
            ok, bad, t0 = rd.window_times[soak_name]
            w = wins.get(soak_name, {})
            span = float(w.get("ran_s") or (max(np.max(ok, initial=t0), np.max(bad, initial=t0)) - t0))
            if span > 0:
                c, k, width = _bins(ok - t0, span, 30)
                soak_scale = scale = soak_scale or (60.0 if span > 600 else 1.0)
                soak_series.append(Series(_name(rd, runs, f"{soak_name}: valid per host-hour"), list(c / scale),
                                          list(k / width * 3600), color=col, mode="lines+markers"))
                ref = _est(w.get("valid_per_host_hour"))
                if ref and ref.value:
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
        s = rd.kind("sweep").get("summary") or {}
        if s:
            notes.append(f"<li>{escape(rd.label)}: N_max = {escape(str(s.get('n_max')))}"
                         + (f"; {escape(str(s['stopped']))}" if s.get("stopped") else "") + "</li>")
    return _plots(*plots) + (f"<ul>{''.join(notes)}</ul>" if notes else "") + \
        '<p class="note">Throughput is claimed only from confirmed windows; bursts are reported as bursts.</p>' + \
        table(head, rows, "num small", row_cls, left={0, 1, 2, 8, 9, 10})


def _invalid_rate(w: dict[str, Any]) -> Estimate | None:
    if w.get("invalid_rate") is not None:
        return _est(w["invalid_rate"])
    if w.get("attempts"):
        return wilson(int(w.get("invalid", 0)), int(w["attempts"]))
    return None


def _share(x: Any) -> tuple[int, int] | float | None:
    if isinstance(x, dict):
        return int(x.get("faithful", 0)), int(x.get("total", 0))
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return int(x[0]), int(x[1])
    if isinstance(x, (int, float)):
        return float(x)
    return None


def sec_branch(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.kind("branch") for rd in runs):
        return None
    dims: list[str] = [d for d in FAITHFUL_DIMS if any(d in (b.get("faithful") or {})
                                                      for rd in runs for b in rd.kind("branch").values())]
    for rd in runs:
        for b in rd.kind("branch").values():
            for d in b.get("faithful") or {}:
                if d not in dims:
                    dims.append(d)
    boxes: list[RangeRow] = []
    rows: list[list[object]] = []
    by_method: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rd in runs:
        items = sorted(rd.kind("branch").items(), key=lambda kv: (str(kv[1].get("method", kv[0])),
                                                                  kv[1].get("k") or 0))
        for name, b in items:
            method = str(b.get("method", name))
            k = b.get("k")
            cs = np.asarray([v for v in b.get("creation_s", []) if v is not None], dtype=float)
            label = _name(rd, runs, method + (f", k={k}" if k is not None else ""))
            col = pal(f"method/{method}")
            if len(cs):
                q = np.quantile(cs, [0.05, 0.25, 0.5, 0.75, 0.95]) * 1000
                boxes.append(RangeRow(label, q[2], q[0], q[4], q[1], q[3], color=col,
                                      tip=f"{label}: median {q[2]:.3g} ms, IQR {q[1]:.3g}–{q[3]:.3g}, "
                                          f"p5–p95 {q[0]:.3g}–{q[4]:.3g} ms, n={len(cs)}"))
                if k is not None:
                    by_method.setdefault((rd.label, method), []).append((float(k), float(q[2])))
            par = np.asarray([v for v in b.get("creation_parallel_s", []) if v is not None], dtype=float)
            cells: list[object] = []
            for d in dims:
                s = _share((b.get("faithful") or {}).get(d))
                if s is None:
                    cells.append("–")
                elif isinstance(s, float):
                    cells.append(Raw(f'<span class="{"ok" if s >= 1 else "bad"}">{s:.0%}</span>'))
                else:
                    f, t = s
                    w = wilson(f, t)
                    tip = f"{f} of {t} faithful" + (f", Wilson 95% [{w.low:.2f}, {w.high:.2f}]" if t else "")
                    cells.append(Raw(f'<span class="{"ok" if t and f == t else "bad"}" title="{escape(tip)}">'
                                     f'{f}/{t}</span>'))
            rows.append([rd.label, method, b.get("env", ""), "–" if k is None else k,
                         b.get("continuations", len(cs)),
                         _ms(quantile(cs, 0.5)) if len(cs) else "–", _ms(quantile(cs, 0.95)) if len(cs) else "–",
                         _ms(quantile(par, 0.5)) if len(par) else "–", *cells,
                         b.get("valid", "–"), fmt_est(_est(b.get("valid_per_host_hour")), ".4g"),
                         fmt_est(_est(b.get("usd_per_valid")), ".3g")])
    plots = []
    if boxes:
        vals = [v for r in boxes for v in (r.lo, r.hi) if v]
        log = bool(vals) and max(vals) / max(min(vals), 1e-9) > 20
        plots.append(svg.range_plot(boxes, "creation time per continuation, ms" + (" (log)" if log else ""),
                                    log_x=log, title="creation time per fork method (box: IQR, whiskers: p5–p95)"))
    growth = [Series(_name(next(r for r in runs if r.label == lab), runs, m), [k for k, _ in pts],
                     [v for _, v in pts], color=pal(f"method/{m}"), mode="lines+markers")
              for (lab, m), pts in by_method.items() if len(pts) > 1]
    if growth:
        plots.append(svg.xy_plot(growth, "k (steps before the fork)", "median creation, ms", log_y=True,
                                 title="creation time against k"))
    head = ["run", "method", "env", "k", "M", "creation p50 ms", "creation p95 ms", "parallel p50 ms",
            *[f"faithful: {d}" for d in dims], "valid", "valid per host-hour", "USD per valid continuation"]
    return _plots(*plots) + table(head, rows, "num small", left=3)


def sec_projection(runs: Sequence[RunData], pal: Palette) -> str | None:
    if not any(rd.kind("projection") for rd in runs):
        return None
    rows: list[list[object]] = []
    bars: list[RangeRow] = []
    for rd in runs:
        for name, p in rd.kind("projection").items():
            sub = str(p.get("substrate", name))
            proj, meas = p.get("projected_s_per_trajectory"), p.get("measured_s_per_trajectory")
            diff = f"{(proj - meas) / meas:+.1%}" if isinstance(proj, (int, float)) and \
                isinstance(meas, (int, float)) and meas else "–"
            wh = _est(p.get("worker_hours"))
            rows.append([rd.label, sub, f"{p.get('trajectories', 0):,} × {p.get('steps', '?')} steps",
                         fmt_est(_est(p.get("cold_start_s")), ".3g"), fmt_est(_est(p.get("reset_s")), ".3g"),
                         fmt_est(_est(p.get("per_step_s")), ".3g"), fmt_est(_est(p.get("verify_s")), ".3g"),
                         _g(proj, ".4g"), _g(meas, ".4g"), diff, fmt_est(wh, ",.0f")])
            if wh is not None and wh.value is not None:
                bars.append(RangeRow(_name(rd, runs, sub), wh.value, wh.low, wh.high, color=pal(_skey(rd, sub))))
    head = ["run", "substrate", "workload", "cold start s", "reset s", "per step s", "verify s",
            "projected s / trajectory", "measured s / trajectory", "projected vs measured", "worker-hours"]
    plot = svg.range_plot(bars, "worker-hours", x_min=0, title="worker-hours per substrate") if bars else ""
    return ('<p class="note">worker-hours = (cold start + steps × per-step overhead + verify) × trajectories / '
            '3600</p>' + table(head, rows, "num small", left=3) + _plots(plot))


def _image(a: dict[str, Any], base: Path | None) -> tuple[str, bytes] | None:
    data: bytes | None = None
    if a.get("png_base64") or a.get("data_base64"):
        try:
            data = base64.b64decode(str(a.get("png_base64") or a.get("data_base64")), validate=True)
        except (binascii.Error, ValueError):
            return None
    elif a.get("path") and base is not None:
        p = Path(a["path"])
        p = p if p.is_absolute() else base / p
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
    if not any(rd.kind("screenshot") for rd in runs):
        return None
    out = []
    for rd in runs:
        shots = rd.kind("screenshot")
        if not shots:
            continue
        by_task: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for name, a in shots.items():
            by_task.setdefault(str(a.get("task", name.split("/")[0])), []).append((name, a))
        shown = 0
        if len(runs) > 1:
            out.append(f"<h3>{escape(rd.label)}</h3>")
        for task, items in by_task.items():
            figs = []
            for name, a in items:
                if shown >= MAX_SCREENSHOTS:
                    break
                img = _image(a, base)
                cap = " · ".join(str(a[k]) for k in ("seq", "stage", "note") if a.get(k) is not None) or name
                if img is None:
                    figs.append(f'<figure class="shot missing"><div>image not available</div>'
                                f'<figcaption>{escape(cap)}</figcaption></figure>')
                    continue
                mime, data = img
                w = int(a.get("width") or 0)
                style = f' style="max-width:{min(w, 480)}px"' if w else ""
                figs.append(f'<figure class="shot"><img alt="{escape(task)} {escape(cap)}"{style} '
                            f'src="data:{mime};base64,{base64.b64encode(data).decode()}">'
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
        for p in _prices(rd):
            f[f"price input: {p['name']}"] = (f"USD {float(p['usd_per_host_hour']):.4g}/host-hour"
                                              + (f" ({p.get('kind')})" if p.get("kind") else "")
                                              + (f" — {p['note']}" if p.get("note") else ""))
            if p.get("inputs"):
                f[f"price input: {p['name']}: inputs"] = json.dumps(p["inputs"])
        if rd.other_kinds:
            f["other artifacts in the ledger"] = ", ".join(f"{k} ({n})" for k, n in sorted(rd.other_kinds.items()))
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
               screenshots_base: Path | None = None) -> str:
    """The page for ``run_ids`` (side by side, in the order given)."""
    if not run_ids:
        raise UsageError("report: give at least one run id")
    base = screenshots_base if screenshots_base is not None else ledger.path.parent
    runs = [_load(ledger, rid, i, (reports or {}).get(rid)) for i, rid in enumerate(dict.fromkeys(run_ids))]
    pal = Palette()
    for rd in runs:
        pal(rd.label)
    sections: list[tuple[str, str, Callable[[], str | None]]] = [
        ("outcomes", "Outcomes", lambda: sec_outcomes(runs, pal)),
        ("cost", "Throughput and USD per valid rollout", lambda: sec_cost(runs, pal)),
        ("latency", "Cold start and phase latency per substrate", lambda: sec_latency(runs, pal)),
        ("sweep", "Sweep: windows, N_max and soak", lambda: sec_sweep(runs, pal)),
        ("branch", "Branch from a prepared state", lambda: sec_branch(runs, pal)),
        ("projection", "Worker-hour projection", lambda: sec_projection(runs, pal)),
        ("screenshots", "Screenshots from the desktop environment", lambda: sec_screenshots(runs, pal, base)),
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
               reports: dict[str, RunReport] | None = None) -> Path:
    page = build_html(ledger, run_ids, reports)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--html: cannot write {path} ({e.strerror}); choose a writable path") from None
    return path
