"""Terminal views of a sweep report, of host prices and of cost attribution (rich)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from drumsbench.measure.cluster import ClusterSummary, ClusterSweepReport
from drumsbench.measure.cost import Attribution, HostFigure
from drumsbench.measure.leaks import METHOD, QUANTITIES, verdict_word
from drumsbench.measure.reports import ProjectionReport, SweepReport
from drumsbench.measure.stats import Estimate
from drumsbench.measure.windows import WindowVerdict


def _res(v: WindowVerdict, key: str, fmt: str, scale: float = 1.0) -> str:
    d = v.resources.get(key) or {}
    if d.get("mean") is None:
        return "-"
    return f"{d['mean'] * scale:{fmt}}/{d['max'] * scale:{fmt}}"


def windows_table(title: str, windows: list[WindowVerdict], burst: bool = False) -> Table:
    t = Table(title=title, show_edge=False)
    for col in ("window", "N", "ran s", "attempts", "invalid", "valid/host-h [95%]", "halves differ", "control",
                "verdict"):
        t.add_column(col, justify="left" if col in ("window", "verdict", "valid/host-h [95%]") else "right")
    for v in windows:
        if burst:
            verdict = "burst (never steady state)"
        else:
            verdict = ("confirmed" if v.confirmed else "NOT confirmed") + (", counted" if v.counted else "")
        t.add_row(v.label, str(v.concurrency), f"{v.ran_s:.1f}", str(v.attempts),
                  "n/a" if v.invalid_rate.value is None else f"{v.invalid} ({v.invalid_rate.value:.1%})",
                  v.valid_per_host_hour.fmt(".4g"),
                  "n/a" if v.halves_differ is None else f"{v.halves_differ:.0%}",
                  {None: "not run", True: "fired", False: "DID NOT FIRE"}[v.control_fired], verdict)
    return t


def resources_table(windows: list[WindowVerdict]) -> Table:
    t = Table(title="host resources beside each window (mean/max)", show_edge=False)
    for col in ("window", "N", "CPU busy", "memory used GiB", "live sandboxes", "samples"):
        t.add_column(col, justify="left" if col == "window" else "right")
    for v in windows:
        t.add_row(v.label, str(v.concurrency), _res(v, "cpu_busy", ".0%"), _res(v, "memory_used_gib", ".2f"),
                  _res(v, "live_sandboxes", ".1f"), str(v.resources.get("samples", "-")))
    return t


def leaks_table(windows: list[WindowVerdict]) -> Table:
    """Each window's leak slopes per hour, ±the half-interval its leak check used, and the check."""
    t = Table(title="leak check: slope per hour ±half-interval at the check's level (1 − 1e-4/m) over each window "
                    "(after its ramp-up)",
              show_edge=False)
    shown = [q for q in QUANTITIES if any(v.leaks and any(s.key == q.key for s in v.leaks.slopes) for v in windows)]
    t.add_column("window")
    t.add_column("fit s (n)", justify="right")
    for q in shown:
        t.add_column(f"{q.key}/h", justify="right")
    t.add_column("leak check")
    for v in windows:
        lv = v.leaks
        if lv is None:
            t.add_row(v.label, "-", *["-" for _ in shown], "not sampled")
            continue
        by = {s.key: s for s in lv.slopes}
        cells = []
        for q in shown:
            sl = by.get(q.key)
            cell = "-" if sl is None else sl.short()
            cells.append(f"[bold red]{cell}[/]" if sl is not None and sl.leaks else cell)
        check = {None: "not judged", True: "pass", False: "FAIL: " + ", ".join(s.key for s in lv.leaking)}[lv.passed]
        t.add_row(v.label, f"{lv.span_to_s - lv.span_from_s:.0f} ({lv.samples})", *cells, check)
    return t


def leaks_text(windows: list[WindowVerdict]) -> Text:
    tol = ", ".join(f"{q.key} {q.tolerance_per_h:g}" for q in QUANTITIES)
    out = Text(f"{METHOD}; tolerances per hour: {tol}\n")
    for v in windows:
        if v.leaks is None:
            continue
        left = ", ".join(f"{k} {x:+.3g}" for k, x in v.leaks.left.items() if x is not None)
        out.append(f"{v.label}: {v.leaks.detail}; after teardown vs before: {left or 'n/a'}\n")
    return out


def reasons(windows: list[WindowVerdict], burst: bool = False) -> Text:
    lines = Text()
    for v in windows:
        lines.append(f"{v.label}: ", style="bold")
        if burst:
            lines.append("burst: checks for information only, never counted as steady state\n")
        else:
            lines.append(("confirmed" if v.confirmed else "NOT confirmed") + "\n")
        for c in v.checks:
            lines.append(f"    {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}\n")
    return lines


def prices_table(figures: list[HostFigure], title: str = "USD per valid rollout, per priced host") -> Table:
    t = Table(title=title, show_edge=False)
    for col in ("host", "USD/host-h", "marginal USD/valid rollout [95%]", "billed h (run h)",
                "billed USD/valid rollout [95%]", "how the hourly price is made"):
        t.add_column(col)
    for f in figures:
        billed = f"{f.billed_hours:.3g} ({f.run_hours:.3g})"
        t.add_row(f.name, f"{f.usd_per_host_hour:.4g}", f.usd_per_valid_rollout.fmt(".3g"), billed,
                  f.billed_usd_per_valid_rollout.fmt(".3g"), f.derivation)
    return t


def attribution_table(a: Attribution) -> Table:
    t = Table(title=f"cost attribution on {a.host} ({a.scope})", show_edge=False)
    for col in ("line", "USD", "USD per 1,000 verified", "source", "how"):
        t.add_column(col, justify="right" if col.startswith("USD") else "left")
    for ln in a.lines:
        t.add_row(ln.name, "excluded" if ln.usd is None else f"{ln.usd:.4g}",
                  "-" if ln.per_1k_verified is None else f"{ln.per_1k_verified:.4g}", ln.source, ln.detail)
    per = "n/a" if a.usd_per_1k_verified is None else f"{a.usd_per_1k_verified:.4g}"
    t.add_row("total", f"{a.total_usd:.4g}", per, "", f"{a.verified_attempts} verified of {a.attempts} attempts")
    return t


def cost_group(figures: list[HostFigure], attributions: list[Attribution], note: str) -> list[RenderableType]:
    out: list[RenderableType] = [prices_table(figures), Text(note), Text("")]
    for a in attributions:
        out += [attribution_table(a), Text("")]
    return out


def _est(e: Estimate) -> str:
    return e.fmt(".4g")


def nodes_table(windows: list[WindowVerdict]) -> Table:
    """Each window's nodes (Ray): attempts, valid per node-hour, finished or lost."""
    t = Table(title="per node (Ray): every node in the cluster during the window, busy or idle", show_edge=False)
    for col in ("window", "N/node", "node", "host", "attempts", "invalid", "valid/node-h [95%]", "finished"):
        t.add_column(col, justify="left" if col in ("window", "node", "host", "valid/node-h [95%]") else "right")
    for v in windows:
        for ln in v.nodes:
            lost = f"LOST ({ln.lost_attempts} in flight)" if ln.lost_attempts or not ln.finished else "yes"
            t.add_row(v.label, str(v.concurrency), ln.node_id[:8], ln.host, str(ln.attempts), str(ln.invalid),
                      ln.valid_per_node_hour.fmt(".4g") if ln.attempts else "idle", lost)
    return t


def cluster_group(c: ClusterSummary) -> list[RenderableType]:
    """N_max per node and for the cluster; the cluster against nodes x node-alone rate (coordination tax)."""
    t = Table(title=f"the cluster ({c.nodes} node(s) on {c.hosts} host(s)) against nodes x one node alone",
              show_edge=False)
    for col in ("N/node", "cluster window", "cluster valid/h [95%]", "per node valid/h", "node alone valid/h [95%]",
                "nodes x alone", "coordination tax [95%]"):
        t.add_column(col, justify="left" if "window" in col else "right")
    for lv in c.levels:
        ok = "confirmed" if lv.cluster_confirmed else "NOT confirmed"
        alone = "-" if lv.alone_per_hour is None else (
            f"{lv.alone_per_hour.fmt('.4g')} ({'confirmed' if lv.alone_confirmed else 'NOT confirmed'})")
        tax = "-" if lv.tax is None or lv.tax.value is None else (
            f"{lv.tax.value:.0%} [{(lv.tax.low or 0):.0%}, {(lv.tax.high or 0):.0%}]")
        t.add_row(str(lv.concurrency), f"{lv.cluster_window} ({ok})", lv.cluster_per_hour.fmt(".4g"),
                  ", ".join("-" if x is None else f"{x:.4g}" for x in lv.per_node_hour), alone,
                  "-" if lv.ideal_per_hour is None else f"{lv.ideal_per_hour:.4g}", tax)
    g = Table.grid(padding=(0, 2))
    g.add_row("N_max per node", "none" if c.n_max_per_node is None else str(c.n_max_per_node),
              "largest N whose node-alone window is confirmed")
    g.add_row("N_max for the cluster", "none" if c.n_max_cluster is None else
              f"{c.n_max_cluster} per node ({c.n_max_cluster * c.nodes} at once)",
              "largest N per node whose cluster window is confirmed")
    return [t, Text(c.note), g, Text("")]


def render(r: SweepReport) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row("sweep", f"{r.run_id} ({r.status})")
    head.add_row("conditions", r.conditions)
    c = r.criteria
    head.add_row("criteria", f"window {c['window_s']:g} s; confirmed when: full length, invalid rate <= "
                 f"{c['invalid_threshold']:.1%}, isolation positive control fired, halves within "
                 f"{c['stability']:.0%}; climb while throughput gains > {c['min_gain']:.0%}")
    head.add_row("host time", f"{r.host_seconds:.1f} s" + (
        " (every host in the cluster during each window, busy or idle)" if isinstance(r, ClusterSweepReport) else ""))
    steady_windows = [v for v in r.windows if v.kind in ("step", "soak")]
    parts: list[RenderableType] = [head, Text(""), windows_table("windows (steady state candidates)", steady_windows)]
    for nr in r.not_run:
        parts.append(Text(f"  N={nr.concurrency}: not run — {nr.reason}"))
    parts += [Text(""), reasons(steady_windows)]
    s = r.steady_state
    summary = Table.grid(padding=(0, 2))
    summary.add_row("N_max", "none" if r.n_max is None else str(r.n_max), r.n_max_reason)
    if r.climb_stopped:
        summary.add_row("climb stopped", "", r.climb_stopped)
    soak = "not run" if r.soak is None else ("held" if r.soak_held else "did NOT hold")
    summary.add_row("soak", soak, s.note)
    if r.leaks_note:
        summary.add_row("leaks", verdict_word(r.leaks_passed),
                        r.leaks_note)
    if r.n_max is None:
        summary.add_row("valid rollouts per host-hour", "none", "no confirmed window: no steady state is claimed")
    else:
        summary.add_row("valid rollouts per host-hour", _est(s.valid_per_host_hour),
                        f"steady state from confirmed windows at N_max only ({', '.join(s.windows) or 'none'}); "
                        f"{s.valid_per_host_hour.method}")
    parts += [summary, Text("")]
    if r.bursts:
        parts += [windows_table("bursts (short peaks: reported as bursts, never as steady state)", r.bursts, True),
                  reasons(r.bursts, True)]
    if isinstance(r, ClusterSweepReport):
        parts += [nodes_table(r.windows), Text(""), *cluster_group(r.cluster)]
    parts += [resources_table(r.windows), Text("")]
    if any(v.leaks is not None for v in r.windows):
        parts += [leaks_table(r.windows), leaks_text(r.windows)]
    if r.n_max is None:
        parts.append(Text("USD per valid rollout: withheld — no window was confirmed, so there is no headline "
                          "(see the reasons above; longer windows or lower N)", style="bold"))
    else:
        parts += cost_group(r.prices, r.attribution, f"inference: {r.inference_cost}")
    return Group(*parts)


def print_sweep(r: SweepReport, console: Console | None = None) -> None:
    (console or Console()).print(render(r))


def _s(e: Estimate, scale: float = 1.0, spec: str = ".1f") -> str:
    if e.value is None:
        return "n/a"
    return f"{e.value * scale:{spec}} [{(e.low or 0) * scale:{spec}}, {(e.high or 0) * scale:{spec}}]"


def projection_group(r: ProjectionReport) -> Group:
    terms = Table(title="measured terms per trajectory, ms (95% intervals)", show_edge=False)
    for col in ("substrate/reset", "N", "attempts", "cold start", "provision (once)", "fresh start",
                "per step", "verify", "harness"):
        terms.add_column(col, justify="left" if col == "substrate/reset" else "right")
    t = Table(title=f"projection: {r.trajectories:,} trajectories of {r.steps} steps (95% intervals)", show_edge=False)
    for col in ("substrate/reset", "s per trajectory", "worker-hours", "s per trajectory + harness",
                "worker-hours + harness"):
        t.add_column(col, justify="left" if col == "substrate/reset" else "right")
    for p in r.projections:
        tm = p.terms
        terms.add_row(p.label, str(p.concurrency), str(tm.n), _s(tm.cold_start, 1000), _s(tm.provision, 1000),
                      _s(tm.fresh_start, 1000), _s(tm.per_step, 1000, ".2f"), _s(tm.verify, 1000),
                      _s(tm.harness, 1000))
        t.add_row(p.label, _s(p.per_trajectory_s, 1, ".3f"), _s(p.worker_hours, 1, ".4g"),
                  _s(p.per_trajectory_full_s, 1, ".3f"), _s(p.worker_hours_full, 1, ".4g"))
    parts: list[RenderableType] = [terms, Text(""), t, Text(r.formula),
                                   Text(r.full_formula + "  (harness: gates, observations, policy, teardown)")]
    checks = [p for p in r.projections if p.check is not None]
    if checks:
        c = Table(title="check against real trajectories", show_edge=False)
        for col in ("substrate/reset", "real runs", "mean steps", "measured s/trajectory", "projected",
                    "error [95%, bootstrap over rounds]", "error + harness", "verdict"):
            c.add_column(col, justify="left" if col in ("substrate/reset", "verdict") else "right")
        for p in checks:
            k = p.check
            assert k is not None
            pr = k.paired
            err = f"{k.error:+.1%}" + ("" if pr is None else f" [{pr.error_interval[0]:+.0%}, "
                                                             f"{pr.error_interval[1]:+.0%}] ({pr.rounds} rounds)")
            c.add_row(p.label, str(k.n), f"{k.mean_steps:.0f}", _s(k.measured_s, 1, ".3f"),
                      _s(k.projected_s, 1, ".3f"), err, f"{k.error_full:+.1%}",
                      f"within {k.tolerance:.0%}" if k.within else f"OUTSIDE {k.tolerance:.0%}")
        parts += [Text(""), c]
    parts.append(Text(f"measured in run(s) {', '.join(r.runs)}, commit {r.commit}"))
    return Group(*parts)
