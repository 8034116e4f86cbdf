"""The sweep: throughput and invalid rate against N, confirmed windows, N_max, and the soak."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import numpy as np

from drumsbench.measure.cluster import NODE_ALONE, coordination_tax
from drumsbench.measure.leaks import METHOD, QUANTITIES, verdict_word
from drumsbench.report import svg
from drumsbench.report.html.cells import (
    Keyed,
    Palette,
    Raw,
    fmt_est,
    fmt_num,
    legend,
    plot_row,
    table,
    time_bins,
)
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import Rule, Series


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
                tips.append(f"{name}: {fmt_num(e.value, '.4g')} valid/host-hour"
                            f" — {'confirmed' if w.confirmed else 'NOT confirmed'}")
                inv.append(ir.value * 100 if ir.value is not None else None)
                ilo.append(ir.low * 100 if ir.low is not None else None)
                ihi.append(ir.high * 100 if ir.high is not None else None)
            thr_series.append(Series(legend(rd, runs, "valid per host-hour (filled = confirmed)"), ns, vals, color=col,
                                     mode="lines+markers", lo=lo, hi=hi, hollow=hollow, tips=tips))
            inv_series.append(Series(legend(rd, runs, "invalid rate"), ns, inv, color=col, mode="lines+markers",
                                     lo=ilo, hi=ihi, hollow=hollow))
            if sweep is not None and sweep.n_max:
                rules_thr.append(Rule(float(sweep.n_max), legend(rd, runs, f"N_max = {sweep.n_max}"), color=col))
            if sweep is not None and not rules_inv:
                rules_inv.append(Rule(sweep.invalid_threshold * 100, f"threshold {sweep.invalid_threshold * 100:g}%",
                                      axis="y", color="#b2182b"))
        for name, w in sorted(wins.items(), key=lambda nw: (nw[1].role != "window", nw[1].concurrency)):
            res = w.resources
            key = f"{rd.label}/window/{name}"
            rows.append([rd.label, name, w.role, w.concurrency,
                         f"{fmt_num(w.ran_s, '.4g')} / {fmt_num(w.planned_s, '.4g')} s",
                         Keyed(f"{key}/attempts", f"{w.attempts:,}"),
                         fmt_est(w.invalid_rate, ".2%"),
                         Keyed(f"{key}/valid_per_host_hour", fmt_est(w.valid_per_host_hour, ".4g")),
                         Keyed(f"{key}/confirmed", Raw('<b class="ok">confirmed</b>' if w.confirmed
                                                       else '<b class="bad">not confirmed</b>')),
                         Raw("<br>".join(escape(x) for x in w.reasons)),
                         ", ".join(f"{k} {fmt_num(v, '.3g')}" for k, v in res.model_dump().items() if v is not None)])
            row_cls.append("" if w.confirmed else "dim")
        soak_name = sweep.soak if sweep is not None else None
        if soak_name and soak_name in rd.window_times and soak_name in wins:
            ok, bad, t0 = rd.window_times[soak_name]
            w = wins[soak_name]
            span = float(w.ran_s or (max(np.max(ok, initial=t0), np.max(bad, initial=t0)) - t0))
            if span > 0:
                c, k, width = time_bins(ok - t0, span, 30)
                soak_scale = scale = soak_scale or (60.0 if span > 600 else 1.0)
                soak_series.append(Series(legend(rd, runs, f"{soak_name}: valid per host-hour"), list(c / scale),
                                          list(k / width * 3600), color=col, mode="lines+markers"))
                ref = w.valid_per_host_hour
                if ref.value:
                    soak_series.append(Series(legend(rd, runs, "soak mean"), [0, span / scale],
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
                         + f"; {escape(sw.note)}"
                         + (f'; leaks: <b data-key="{escape(rd.label)}/sweep/leaks_passed">'
                            f"{verdict_word(sw.leaks_passed)}</b> "
                            f"({escape(sw.leaks_note)})" if sw.leaks_note else "") + "</li>")
    return plot_row(*plots) + (f"<ul>{''.join(notes)}</ul>" if notes else "") + \
        '<p class="note">Throughput is claimed only from confirmed windows; bursts are reported as bursts.</p>' + \
        table(head, rows, "num small", row_cls, left={0, 1, 2, 8, 9, 10}) + cluster_table(runs) + leaks_table(runs)


def cluster_table(runs: Sequence[RunData]) -> str:
    """On Ray: each node's share of the sweep, and each N's cluster window against nodes x one node
    alone (``node-N<n>``): the coordination tax."""
    node_rows: list[list[object]] = []
    tax_rows: list[list[object]] = []
    for rd in runs:
        nodes = rd.report.nodes
        if len(nodes) < 2:
            continue
        for node_id, ln in nodes.items():
            node_rows.append([rd.label, node_id[:8], ln.host, f"{ln.attempts:,}", f"{ln.invalid:,}", ln.lost,
                              Keyed(f"{rd.label}/node/{node_id[:8]}/valid_per_node_hour",
                                    fmt_est(ln.valid_per_node_hour, ".4g"))])
        wins = rd.art.windows
        for name, w in sorted(wins.items(), key=lambda nw: nw[1].concurrency):
            alone = wins.get(f"{NODE_ALONE}{name}")
            if w.role != "window" or alone is None:
                continue
            ran = sum(1 for ln in nodes.values() if ln.attempts)
            tax = coordination_tax(w.valid_per_host_hour, alone.valid_per_host_hour, ran)
            tax_txt = "–" if tax is None or tax.value is None else \
                f"{tax.value:.0%} [{(tax.low or 0):.0%}, {(tax.high or 0):.0%}]"
            tax_rows.append([rd.label, w.concurrency, name, fmt_est(w.valid_per_host_hour, ".4g"),
                             "confirmed" if w.confirmed else "not confirmed",
                             fmt_est(alone.valid_per_host_hour, ".4g"),
                             "confirmed" if alone.confirmed else "not confirmed", ran,
                             Keyed(f"{rd.label}/tax/N{w.concurrency}", tax_txt)])
    if not node_rows:
        return ""
    out = ('<p class="note">Ray nodes: each node\'s attempts and valid rollouts per node-hour over the sweep; a '
           "window's host-hours count every host in the cluster, busy or idle.</p>"
           + table(["run", "node", "host", "attempts", "invalid", "lost in flight", "valid per node-hour"],
                   node_rows, "num small", left={0, 1, 2}))
    if tax_rows:
        out += ('<p class="note">Coordination tax = 1 − cluster rate / (nodes × one node alone at the same N per '
                "node); nodes sharing one machine share its cores, so there it includes that contention.</p>"
                + table(["run", "N per node", "cluster window", "valid per host-hour", "", "node alone",
                         "", "nodes", "coordination tax [95%]"], tax_rows, "num small", left={0, 2, 4, 6}))
    return out


def leaks_table(runs: Sequence[RunData]) -> str:
    """Each window's leak check: the slope per hour of each sampled quantity ±the half-interval its check used."""
    wins = [(rd, name, w) for rd in runs for name, w in rd.art.windows.items() if w.leaks is not None]
    if not wins:
        return ""
    shown = [q for q in QUANTITIES if any(s.key == q.key for _, _, w in wins if w.leaks for s in w.leaks.slopes)]
    head = ["run", "window", "N", "fitted s (samples)", *[f"{q.key} per hour" for q in shown], "leak check",
            "after teardown − before"]
    rows: list[list[object]] = []
    for rd, name, w in wins:
        lv = w.leaks
        assert lv is not None
        by = {s.key: s for s in lv.slopes}
        cells: list[object] = []
        for q in shown:
            sl = by.get(q.key)
            text = "–" if sl is None else sl.short()
            cells.append(Raw(f'<b class="bad">{escape(text)}</b>') if sl is not None and sl.leaks else text)
        check = {None: "not judged", True: Raw('<b class="ok">pass</b>'),
                 False: Raw('<b class="bad">FAIL: ' + escape(", ".join(s.key for s in lv.leaking)) + "</b>")}[lv.passed]
        key = f"{rd.label}/leaks/{name}"
        rows.append([rd.label, name, w.concurrency, f"{lv.span_to_s - lv.span_from_s:.0f} ({lv.samples})", *cells,
                     Keyed(f"{key}/passed", check),
                     ", ".join(f"{k} {v:+.3g}" for k, v in lv.left.items() if v is not None)])
    tol = ", ".join(f"{q.key} {q.tolerance_per_h:g}" for q in QUANTITIES)
    return (f'<p class="note">Leak check: {escape(METHOD)}. Tolerances per hour: {escape(tol)}. Sampled: fds of '
            "the harness, processes and zombies under it, its mounts, entries in the host's shared places and "
            "/dev/shm, "
            "the sandbox store's disk use, dockerd / conmon RSS on docker / podman.</p>"
            + table(head, rows, "num small", left={0, 1, 4 + len(shown), 5 + len(shown)}))
