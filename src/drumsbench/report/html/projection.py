"""The worker-hour projection per substrate, beside what was measured."""

from __future__ import annotations

from collections.abc import Sequence

from drumsbench.report import svg
from drumsbench.report.html.cells import Keyed, Palette, color_key, fmt_est, fmt_num, legend, plot_row, table
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import RangeRow


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
                         fmt_num(proj, ".4g"), fmt_num(meas, ".4g"), diff,
                         Keyed(f"{rd.label}/projection/{name}/worker_hours", fmt_est(wh, ".4g"))])
            if wh.value is not None:
                bars.append(RangeRow(legend(rd, runs, p.substrate), wh.value, wh.low, wh.high,
                                     color=pal(color_key(rd, p.substrate))))
    head = ["run", "substrate", "workload", "cold start s", "reset s", "per step s", "verify s",
            "projected s / trajectory", "measured s / trajectory", "projected vs measured", "worker-hours"]
    plot = svg.range_plot(bars, "worker-hours", x_min=0, title="worker-hours per substrate") if bars else ""
    return ('<p class="note">worker-hours = (cold start + steps × per-step overhead + verify) × trajectories / '
            '3600</p>' + table(head, rows, "num small", left=3) + plot_row(plot))
