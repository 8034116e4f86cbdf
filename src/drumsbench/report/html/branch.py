"""Branch from a prepared state: creation cost (restore included, wherever it was paid), the
hand-over apart, the faithfulness check's own cost, faithfulness per fork method, and each method
against replay end to end (valid continuations per host-hour) beside the creation ratio."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from drumsbench.measure.artifacts import BranchMethodArtifact
from drumsbench.report import svg
from drumsbench.report.html.cells import (
    Keyed,
    Palette,
    Raw,
    box_ms,
    fmt_est,
    fmt_ms,
    legend,
    log_scale,
    plot_row,
    table,
)
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import RangeRow, Series

FAITHFUL_DIMS = ("pixels", "text", "cursor", "selection", "undo", "modified", "dialogs", "locks")


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
            label = legend(rd, runs, f"{b.method}, k={b.k}")
            col = pal(f"method/{b.method}")
            box = box_ms(label, b.creation_sequential.samples_s, col)
            if box is not None:
                box.tip = (f"{label}: median {box.value:.3g} ms, IQR {box.q1:.3g}–{box.q3:.3g}, "
                           f"p5–p95 {box.lo:.3g}–{box.hi:.3g} ms, n={len(b.creation_sequential.samples_s)}")
                boxes.append(box)
            pts = sorted((int(k), e.value * 1000) for k, e in b.creation_by_k.items() if e.value is not None)
            if len(pts) > 1:
                growth.append(Series(legend(rd, runs, b.method), [float(k) for k, _ in pts], [v for _, v in pts],
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
                         Keyed(f"{key}/creation_p50_ms", fmt_ms(b.creation_sequential.p50)),
                         Keyed(f"{key}/creation_p95_ms", fmt_ms(b.creation_sequential.p95)),
                         Keyed(f"{key}/creation_parallel_p50_ms", fmt_ms(b.creation_parallel.p50)),
                         Keyed(f"{key}/handover_p50_ms", _handover(b)),
                         Keyed(f"{key}/capture_p50_ms", fmt_ms(b.capture.p50) if b.capture else fmt_est(None)),
                         *cells,
                         Keyed(f"{key}/valid", f"{b.valid} of {b.continuations}"),
                         Keyed(f"{key}/valid_per_host_hour", fmt_est(b.valid_per_host_hour, ".4g")),
                         Keyed(f"{key}/usd_per_valid", fmt_est(b.usd_per_valid_continuation, ".3g"))])
    plots = []
    if boxes:
        log = log_scale([v for r in boxes for v in (r.lo, r.hi) if v])
        plots.append(svg.range_plot(boxes, "creation time per continuation, ms" + (" (log)" if log else ""),
                                    log_x=log, title="creation time per fork method (box: IQR, whiskers: p5–p95)"))
    if growth:
        plots.append(svg.xy_plot(growth, "k (steps before the fork)", "median creation, ms", log_y=True,
                                 title="creation time against k"))
    head = ["run", "method", "env", "k", "M", "creation p50 ms (restore included)", "creation p95 ms",
            "all at once p50 ms", "hand-over p50 ms (made ahead)", "check p50 ms (capture + compare)",
            *[f"faithful: {d}" for d in dims], "valid", "valid per host-hour", "USD per valid continuation"]
    notes = []
    for rd in runs:
        bs = rd.art.branch_summary
        if bs is not None:
            for r in bs.ratios:
                key = f"{rd.label}/branch/ratio/{r.method}"
                notes.append(f"<li>{escape(rd.label)}: {escape(r.method)} / {escape(r.baseline)} valid continuations "
                             f"per host-hour, end to end: <b data-key=\"{escape(key)}/end_to_end\">"
                             f"{fmt_est(r.end_to_end, '.3g', unit='×')}</b>; {escape(r.baseline)} / {escape(r.method)} "
                             f"creation time (restore included): <span data-key=\"{escape(key)}/creation\">"
                             f"{fmt_est(r.creation, '.3g', unit='×')}</span></li>")
            notes.append(f"<li>{escape(rd.label)}: task {escape(bs.task)} on {escape(bs.substrate)}, k={bs.k}; the "
                         f"prepared state unchanged afterwards: <b data-key=\"{escape(rd.label)}/branch/unchanged\">"
                         f"{bs.prepared_unchanged}</b>; isolation positive control "
                         f"{'fired' if bs.isolation_control_fired else 'DID NOT FIRE'}</li>")
    return (plot_row(*plots) + (f"<ul>{''.join(notes)}</ul>" if notes else "") +
            table(head, rows, "num small", left=3))


def _handover(b: BranchMethodArtifact) -> Raw:
    """The caller's wait per fork (p50), with how many were made ahead of demand; n/a in a ledger
    written before it was kept apart from creation."""
    if b.handover_sequential is None:
        return fmt_est(None)
    cell = fmt_ms(b.handover_sequential.p50)
    return Raw(cell + (f" ({b.made_ahead} of {b.continuations})" if b.made_ahead else ""))
