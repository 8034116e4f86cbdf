"""Throughput and USD per valid rollout per price input, and completions over time."""

from __future__ import annotations

import math
from collections.abc import Sequence

from drumsbench.measure.stats import inverse
from drumsbench.report import svg
from drumsbench.report.html.cells import Keyed, Palette, Raw, fmt_est, legend, log_scale, plot_row, table, time_bins
from drumsbench.report.html.data import RunData, throughput_basis
from drumsbench.report.svg import RangeRow, Series


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
                ranges.append(RangeRow(legend(rd, runs, name), e.value, e.low, e.high if e.high != math.inf else None,
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
        log = log_scale([r.value for r in ranges if r.value], floor=1e-12)
        plots.append(svg.range_plot(ranges, "USD per valid rollout (95% interval)", log_x=log,
                                    title="USD per valid rollout per price input", x_min=None if log else 0))
    for rd in runs:  # one small plot per run: runs of different lengths do not share a time axis
        span = rd.report.host_seconds
        if span <= 0:
            continue
        c, k, w = time_bins(rd.timeline[0], span)
        x_scale, unit = (60.0, "min") if span > 600 else (1.0, "s")
        series = [Series("valid per host-hour", list(c / x_scale), list(k / w * 3600), color=pal(rd.label),
                         mode="lines+markers" if len(c) < 15 else "lines")]
        ci, ki, wi = time_bins(rd.timeline[1], span)
        if ki.sum():
            series.append(Series("invalid per host-hour", list(ci / x_scale), list(ki / wi * 3600),
                                 color=pal(rd.label), dash=True))
        title = "completions over time" + (f" — {rd.label}" if len(runs) > 1 else "")
        plots.append(svg.xy_plot(series, f"host time into the run ({unit}; dead time removed)", "per host-hour",
                                 y_min=0, title=title, width=460 if len(runs) > 1 else 560))
    return out + plot_row(*plots)
