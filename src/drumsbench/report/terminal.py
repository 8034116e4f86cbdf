"""The quick view: a run report rendered for a terminal with rich."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from drumsbench.measure.summary import RunReport
from drumsbench.report.tables import ms


def render(r: RunReport) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row("run", f"{r.run_id} ({r.kind}, {r.status})")
    head.add_row("conditions", r.conditions)
    head.add_row("host time", f"{r.host_seconds:.1f} s in {r.segments} segment(s)" + (
        f" = {r.host_count} hosts x {r.wall_seconds:.1f} s" if r.host_count > 1 else ""))

    out = Table(title="outcomes", show_edge=False)
    out.add_column("outcome")
    out.add_column("attempts", justify="right")
    out.add_column("note")
    out.add_row("attempts", str(r.attempts), "")
    out.add_row("valid", str(r.valid), "success + failed")
    out.add_row("  success (reward 1)", str(r.success), "")
    out.add_row("  failed (reward 0)", str(r.failed), "")
    out.add_row("invalid (no reward)", str(r.invalid_total), "never scored 0")
    for cause, n in r.invalid.items():
        inj = r.injected[cause]
        note = f"{inj} injected, {r.injected_caught[cause]} caught as {cause}" if inj else ""
        out.add_row(f"  {cause}", str(n), note)
    out.add_row("invalid, not injected", str(r.invalid_not_injected), "")

    m = Table(title="figures (95% intervals)", show_edge=False)
    m.add_column("figure")
    m.add_column("value [interval]")
    m.add_column("method")
    m.add_row("success rate over valid", r.success_rate.fmt(".3f"), f"wilson, n={r.success_rate.n}")
    m.add_row("verdicts", r.trust_line(), "who decided (docs/attribution.md)")
    m.add_row("invalid rate", r.invalid_rate.fmt(".3f"), f"wilson, n={r.invalid_rate.n}")
    m.add_row("valid rollouts per host-hour", r.valid_per_host_hour.fmt(".4g"),
              f"{r.headline_basis}; {r.valid_per_host_hour.method}")
    m.add_row(f"USD per valid rollout ({r.price.name})", r.usd_per_valid_rollout.fmt(".3g"),
              f"{r.headline_basis}; USD {r.price.usd_per_host_hour:g}/host-hour; {r.inference_cost}")
    ctrl = ("fired" if r.isolation_confirmed else "DID NOT FIRE: isolation unconfirmed") if r.controls else \
        "not run: isolation unconfirmed"
    m.add_row("isolation positive control", ctrl, "; ".join(c.detail for c in r.controls[:2]))

    lat = Table(title="phase latency, ms (order-statistics intervals)", show_edge=False)
    for col in ("phase", "n", "p50", "p95", "p99"):
        lat.add_column(col, justify="right" if col != "phase" else "left")
    for name, p in r.phases.items():
        if p.n:
            lat.add_row(name, str(p.n), ms(p.p50), ms(p.p95), ms(p.p99))

    tasks = Table(title="per task", show_edge=False)
    for col in ("task", "attempts", "success", "failed", "invalid"):
        tasks.add_column(col, justify="right" if col != "task" else "left")
    for name, t in r.tasks.items():
        tasks.add_row(name, str(t.attempts), str(t.success), str(t.failed), str(t.invalid))
    parts: list[Table | Text] = [head, Text(""), out, Text(""), m,
                                 Text(f"headline basis: {r.headline_basis} (a sweep confirms windows)"),
                                 Text(""), lat, Text(""), tasks]
    if r.ways:
        ways = Table(title="how attempts ran (from each attempt's record), phase latency in ms", show_edge=False)
        for col in ("aspect", "way", "attempts", "invalid", "p50", "p95"):
            ways.add_column(col, justify="right" if col in ("attempts", "invalid", "p50", "p95") else "left")
        for w in r.ways:
            ways.add_row(w.aspect, w.way, str(w.attempts), str(w.invalid), ms(w.latency.p50), ms(w.latency.p95))
        parts += [Text(""), ways]
    for s in r.sabotage:
        n = len(s.strategies)
        bad = s.reached_success or s.reached_invalid
        line = (f"sabotage strategies on {s.substrate}/{s.env} ({s.attempts} attempts): reached success: "
                f"{len(s.reached_success)} of {n}; reached invalid: {len(s.reached_invalid)} of {n}")
        if bad:
            line += f"  ESCAPED: {', '.join(s.reached_success + s.reached_invalid)}"
        parts += [Text(""), Text(line, style="bold red" if bad else "")]
    if r.host_count > 1 or any(h.nodes > 1 for h in r.hosts.values()):
        hosts = Table(title="per host", show_edge=False)
        for col in ("host", "nodes", "attempts", "success", "failed", "invalid", "valid per host-hour"):
            hosts.add_column(col, justify="right" if col != "host" else "left")
        for name, h in r.hosts.items():
            hosts.add_row(name, str(h.nodes), str(h.attempts), str(h.success), str(h.failed), str(h.invalid),
                          h.valid_per_host_hour.fmt(".4g"))
        parts += [Text(""), hosts]
    return Group(*parts)


def print_report(r: RunReport, console: Console | None = None) -> None:
    (console or Console()).print(render(r))


def progress_grid(elapsed: float, counts: Mapping[str, int]) -> Table:
    """The live line of a running ``drumsbench run``: elapsed time, attempts, rate and outcomes so far."""
    done = sum(counts[k] for k in ("success", "failed", "invalid"))
    t = Table.grid(padding=(0, 2))
    t.add_row(f"elapsed {elapsed:5.1f} s", f"attempts {done}", f"rate {done / max(elapsed, 1e-9):.1f}/s",
              f"success {counts['success']}", f"failed {counts['failed']}", f"invalid {counts['invalid']}")
    return t
