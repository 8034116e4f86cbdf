"""Terminal tables of the experiment commands (branch, coldstart, isolation), built from their typed
artifacts (``measure/artifacts.py``) — the same objects the ledger keeps and the HTML report reads."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from drumsbench.measure.artifacts import BranchSummaryArtifact, ColdstartArtifact, IsolationArtifact
from drumsbench.measure.stats import Estimate


def ms(e: Estimate | None) -> str:
    """Seconds as 'p [low, high]' in milliseconds; 'n/a' when there is no value."""
    if e is None or e.value is None:
        return "n/a"
    if e.low is None or e.high is None:
        return f"{e.value * 1000:.1f}"
    return f"{e.value * 1000:.1f} [{e.low * 1000:.1f}, {e.high * 1000:.1f}]"


def branch_group(report: BranchSummaryArtifact, ks: Sequence[int]) -> Group:
    t = Table(title=f"branch from a prepared state: {report.task}, k={report.k}, {report.substrate} (95% intervals)")
    t.add_column("figure")
    for m in report.methods:
        t.add_column(m.method)
    dims = sorted({d for m in report.methods for d in m.faithful})
    n = max((m.continuations for m in report.methods), default=0)
    rows = [
        ("creation, one at a time p50 (ms)", [ms(m.creation_sequential.p50) for m in report.methods]),
        ("  p95", [ms(m.creation_sequential.p95) for m in report.methods]),
        (f"creation, {n} at once p50 (ms)", [ms(m.creation_parallel.p50) for m in report.methods]),
        ("faithful on every dimension", [m.faithful_all.estimate.fmt(".2f") for m in report.methods]),
        *((f"  faithful: {d}", [m.faithful[d].estimate.fmt(".2f") if d in m.faithful else "n/a"
                                for m in report.methods]) for d in dims),
        ("valid / success continuations", [f"{m.valid} / {m.success} of {m.continuations}" for m in report.methods]),
        ("invalid by cause", [", ".join(f"{c} {k}" for c, k in m.invalid.items()) or "0" for m in report.methods]),
        ("valid continuations per host-hour", [m.valid_per_host_hour.fmt(".4g") for m in report.methods]),
        (f"USD per valid continuation ({report.price.name})",
         [m.usd_per_valid_continuation.fmt(".3g") for m in report.methods]),
        *((f"creation p50 at k={kk} (ms)", [ms(m.creation_by_k.get(str(kk))) for m in report.methods])
          for kk in ks),
    ]
    for label, cells in rows:
        t.add_row(label, *cells)
    parts: list[RenderableType] = [t]
    replay = next((m for m in report.methods if m.method == "replay"), None)
    if replay is not None and len(report.methods) > 1:
        base = replay.creation_sequential.p50.value or 0
        for m in report.methods:
            if m.method != "replay" and m.creation_sequential.p50.value:
                parts.append(Text(f"replay / {m.method} creation time: {base / m.creation_sequential.p50.value:.1f}x"))
    parts.append(Text(f"prepared state unchanged afterwards: {report.prepared_unchanged}; isolation positive control "
                      f"{'fired' if report.isolation_control_fired else 'DID NOT FIRE'}; run {report.run_id}"))
    for m in report.methods:
        for problem in m.errors[:3]:
            parts.append(Text(f"{m.method}: {problem}"))
    return Group(*parts)


def coldstart_group(results: Sequence[ColdstartArtifact], mode: str, n: int, idle: int, run_id: str) -> Group:
    t = Table(title=f"cold start, {mode}, n={n} per substrate (ms, 95% intervals)")
    t.add_column("figure")
    for r in results:
        t.add_column(f"{r.substrate} ({r.isolation})")
    rows: list[tuple[str, list[str]]] = [
        ("create -> first command p50", [ms(r.first_command.p50) for r in results]),
        ("  p95", [ms(r.first_command.p95) for r in results]),
        ("  p99", [ms(r.first_command.p99) for r in results]),
        ("raw floor p50", [ms(r.floor.p50 if r.floor else None) + (f"  `{' '.join(r.floor_argv)}`"[:40]
                                                                  if r.floor_argv else "") for r in results]),
        ("ratio to raw floor (p50)", [f"{r.ratio_to_floor:.2f}" if r.ratio_to_floor else "n/a" for r in results]),
        ("success rate", [r.success.fmt(".3f") for r in results]),
        ("teardown p50", [ms(r.teardown.p50) for r in results]),
        ("idle sandbox, MiB (MemAvailable drop)", [f"{r.idle_memory_mib:.1f}" if r.idle_memory_mib is not None
                                                   else "n/a" for r in results]),
        ("idle sandbox, MiB (PSS of its processes)", [f"{r.idle_pss_mib:.1f}" if r.idle_pss_mib is not None
                                                      else "n/a (not host-labelled)" for r in results]),
    ]
    for strategy in ("in_place", "recreate"):
        rows.append((f"reset {strategy} p50", [ms(r.reset[strategy].p50) if strategy in r.reset else "n/a"
                                               for r in results]))
    rows.append(("recreate / in_place", [f"{r.reset_ratio_recreate_over_in_place:.2f}"
                                         if r.reset_ratio_recreate_over_in_place else "n/a" for r in results]))
    for label, cells in rows:
        t.add_row(label, *cells)
    return Group(t, Text(f"run {run_id}; idle memory: the drop of MemAvailable with {idle} idle sandboxes (noisy on "
                         "a busy host), and the PSS of the host processes labelled with the run"))


def isolation_group(results: Sequence[IsolationArtifact]) -> Group:
    t = Table(title="isolation: escape attempts from inside a sandbox (verdict; ran; control)")
    t.add_column("probe")
    for r in results:
        t.add_column(f"{r.substrate} ({r.declared})")
    probes = [p.probe for p in results[0].probes] if results else []
    for i, probe in enumerate(probes):
        cells = []
        for r in results:
            p = r.probes[i]
            cells.append(f"{p.verdict}; ran: {'yes' if p.ran else 'no'}; "
                         f"contained: {'-' if p.contained is None else 'yes' if p.contained else 'no'}; "
                         f"control: {p.control}: {p.detail}")
        t.add_row(probe, *cells)
    t.add_row("canary positive control", *("fired" if r.canary_control_fired else "DID NOT FIRE" for r in results))
    return Group(t)
