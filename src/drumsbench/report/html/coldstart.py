"""Phase latency per substrate (CDFs and percentiles) and the cold-start experiment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from drumsbench.measure.stats import quantile
from drumsbench.measure.summary import PHASES
from drumsbench.report import svg
from drumsbench.report.html.cells import (
    Keyed,
    Palette,
    box_ms,
    cdf,
    cdf_plot,
    color_key,
    fmt_est,
    fmt_ms,
    legend,
    plot_row,
    table,
)
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import RangeRow, Series


def sec_latency(runs: Sequence[RunData], pal: Palette) -> str | None:
    plots = []
    cold_series = []
    for rd in runs:
        for a in rd.art.coldstart.values():
            vals = np.asarray(a.first_command.samples_s, dtype=float)
            if len(vals):
                x, p = cdf(vals * 1000)
                sub = a.substrate
                cold_series.append(Series(legend(rd, runs, f"{sub} (cold-start experiment)"), list(x), list(p * 100),
                                          color=pal(color_key(rd, sub))))
    if cold_series:
        plots.append(cdf_plot(cold_series, "cold start: create a sandbox and run its first command"))
    for phase in PHASES:
        series = []
        for rd in runs:
            for sub, ph in rd.samples.items():
                v = ph.get(phase)
                if v is None or not len(v):
                    continue
                x, p = cdf(v * 1000)
                series.append(Series(legend(rd, runs, sub), list(x), list(p * 100), color=pal(color_key(rd, sub)),
                                     mode="lines+markers" if len(x) < 25 else "lines"))
        if series:
            what = {"provision": "provision (sandbox created for the attempt: cold start within runs)",
                    "reset": "reset (to the task's verified start)", "step": "one step (action applied, observed)",
                    "verify": "verify", "teardown": "teardown", "attempt": "whole attempt"}[phase]
            plots.append(cdf_plot(series, what))
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
                rows.append([rd.label, sub, phase, f"{len(xs):,}",
                             *[fmt_ms(quantile(xs, q)) for q in (0.5, 0.95, 0.99)]])
        for a in rd.art.coldstart.values():
            vals = np.sort(np.asarray(a.first_command.samples_s, dtype=float))
            if len(vals):
                rows.append([rd.label, a.substrate, "cold start (experiment)", f"{len(vals):,}",
                             *[fmt_ms(quantile(vals, q)) for q in (0.5, 0.95, 0.99)]])
    return plot_row(*plots) + '<p class="note">Percentiles with order-statistics 95% intervals.</p>' + \
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
                     Keyed(f"{key}/first_command_p50_ms", fmt_ms(a.first_command.p50)), fmt_ms(a.first_command.p95),
                     Keyed(f"{key}/floor_p50_ms", fmt_ms(a.floor.p50) if a.floor else "n/a"),
                     "n/a" if a.ratio_to_floor is None else f"{a.ratio_to_floor:.2f}",
                     fmt_ms(a.teardown.p50), "n/a" if a.idle_memory_mib is None else f"{a.idle_memory_mib:.1f}",
                     Keyed(f"{key}/reset_in_place_p50_ms",
                           fmt_ms(a.reset["in_place"].p50) if "in_place" in a.reset else "n/a"),
                     Keyed(f"{key}/reset_recreate_p50_ms",
                           fmt_ms(a.reset["recreate"].p50) if "recreate" in a.reset else "n/a"),
                     fmt_est(a.success, ".3f")])
        for strategy, lat in a.reset.items():
            box = box_ms(legend(rd, runs, f"{a.substrate} {strategy}"), lat.samples_s, pal(color_key(rd, a.substrate)))
            if box is not None:
                resets.append(box)
    plots = []
    floors = [Series(legend(rd, runs, f"{a.substrate} raw floor"), *_xy_cdf(a.floor.samples_s),
                     color=pal(color_key(rd, a.substrate)), dash=True)
              for rd, a in items if a.floor and a.floor.samples_s]
    firsts = [Series(legend(rd, runs, f"{a.substrate} create -> first command"), *_xy_cdf(a.first_command.samples_s),
                     color=pal(color_key(rd, a.substrate))) for rd, a in items if a.first_command.samples_s]
    if firsts:
        plots.append(cdf_plot(firsts + floors, "cold start beside each substrate's raw floor (dashed)"))
    if resets:
        plots.append(svg.range_plot(resets, "reset, ms (box: IQR, whiskers: p5–p95)",
                                    title="reset per strategy"))
    return plot_row(*plots) + table(head, rows, "num small", left=4)


def _xy_cdf(samples_s: Sequence[float]) -> tuple[list[float], list[float]]:
    x, p = cdf(np.asarray(samples_s, dtype=float) * 1000)
    return list(x), list(p * 100)


def sec_desktop_coldstart(runs: Sequence[RunData], pal: Palette) -> str | None:
    """``coldstart --tasks desktop`` per substrate: start to the first good screenshot, the sandbox's
    part of it, its raw floor, resets per strategy."""
    items = [(rd, a) for rd in runs for a in rd.art.desktop_coldstart.values()]
    if not items:
        return None
    head = ["run", "substrate", "isolation", "task", "n", "start p50 ms", "p95 ms", "create p50 ms",
            "raw floor p50 ms", "reset in place p50 ms", "reset recreate p50 ms", "success"]
    rows: list[list[object]] = []
    for rd, a in items:
        key = f"{rd.label}/desktop-coldstart/{a.substrate}"
        rows.append([rd.label, a.substrate, a.isolation, a.task, f"{a.start.n:,}",
                     Keyed(f"{key}/start_p50_ms", fmt_ms(a.start.p50)), fmt_ms(a.start.p95), fmt_ms(a.create.p50),
                     fmt_ms(a.floor.p50) if a.floor else "n/a",
                     fmt_ms(a.reset["in_place"].p50) if "in_place" in a.reset else "n/a",
                     fmt_ms(a.reset["recreate"].p50) if "recreate" in a.reset else "n/a",
                     fmt_est(a.success, ".3f")])
    starts = [Series(legend(rd, runs, f"{a.substrate} start"), *_xy_cdf(a.start.samples_s),
                     color=pal(color_key(rd, a.substrate))) for rd, a in items if a.start.samples_s]
    plots = [cdf_plot(starts, "desktop: create to the first good screenshot")] if starts else []
    return plot_row(*plots) + table(head, rows, "num small", left=4)
