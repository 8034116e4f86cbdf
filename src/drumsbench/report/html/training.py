"""``drumsbench train``: learning curves, final evaluations, paired differences and costs per treatment."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from drumsbench.report import svg
from drumsbench.report.html.cells import Keyed, Palette, fmt_est, fmt_num, legend, plot_row, table
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import Series


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
            curves.append(Series(legend(rd, runs, c.treatment), [p.iteration for p in pts],
                                 [None if p.success.value is None else p.success.value * 100 for p in pts],
                                 color=col, mode="lines+markers",
                                 lo=[None if p.success.low is None else p.success.low * 100 for p in pts],
                                 hi=[None if p.success.high is None else p.success.high * 100 for p in pts]))
            mass.append(Series(legend(rd, runs, f"{c.treatment}: sabotage"), [p.iteration for p in pts],
                               [p.mass_sabotage * 100 for p in pts], color=col, dash=True))
        for f in t.finals:
            key = f"{rd.label}/train/{f.treatment}"
            finals.append([rd.label, f.treatment, Keyed(f"{key}/final_success", fmt_est(f.success, ".3f")),
                           fmt_est(f.pooled, ".3f"), f"{f.successes} of {f.valid}",
                           ", ".join("–" if v is None else f"{v:.2f}" for v in f.per_seed)])
        for d in t.comparisons:
            diffs.append([rd.label, f"{d.a} − {d.b}", Keyed(f"{rd.label}/train/{d.a}-{d.b}/difference",
                                                           fmt_est(d.difference, "+.3f")),
                          fmt_num(d.p_paired_permutation, ".3g"), fmt_num(d.p_fisher, ".3g"), d.note])
        for k in t.costs:
            costs.append([rd.label, k.treatment, f"{k.attempts:,}", f"{k.valid:,}", fmt_est(k.invalid_rate, ".2%"),
                          f"{k.retries:,}", Keyed(f"{rd.label}/train/{k.treatment}/invalid_in_loss",
                                                  f"{k.invalid_in_loss:,}"),
                          fmt_num(k.host_s, ".4g"), fmt_num(k.usd_per_valid_rollout, ".3g"),
                          f"{k.reached_90}" + (f" ({fmt_est(k.host_s_to_90, '.3g')} s)" if k.host_s_to_90 else "")])
    plots = [svg.xy_plot(curves, "iteration", "clean eval success, % (95% interval over seeds)", y_min=0, y_max=100,
                         x_integer=True, title="learning curves per treatment"),
             svg.xy_plot(mass, "iteration", "% of first-step probability on sabotage actions", y_min=0,
                         x_integer=True, title="probability mass on sabotage")]
    notes = "".join(f"<li>{escape(rd.label)}: {escape(t.conditions)}</li>" for rd, t in items if t is not None)
    return (plot_row(*plots) + f"<ul>{notes}</ul>" +
            table(["run", "treatment", "final eval success (mean over seeds)", "pooled", "successes", "per seed"],
                  finals, "num small", left=2) +
            table(["run", "difference", "paired mean [95%]", "p (sign-flip)", "p (Fisher)", "note"], diffs,
                  "num small", left={0, 1, 5}) +
            table(["run", "treatment", "attempts", "valid", "invalid rate", "retries", "invalid in the loss",
                   "host s", "USD per valid rollout", "seeds reaching 90%"], costs, "num small", left=2))
