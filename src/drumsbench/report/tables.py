"""Terminal tables of the commands: the experiments (branch, coldstart, isolation) built from their
typed artifacts (``measure/artifacts.py``) — the same objects the ledger keeps and the HTML report
reads — the train report, and ``doctor``'s substrates. The CLI only prints them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from drumsbench.measure.artifacts import (
    BranchMethodArtifact,
    BranchNode,
    BranchSummaryArtifact,
    ColdstartArtifact,
    DesktopColdstartArtifact,
    IsolationArtifact,
    Latency,
)
from drumsbench.measure.pool import PoolColdstartArtifact
from drumsbench.measure.stats import Estimate


def _interval(e: Estimate | None, num: Callable[[float], str], unit: str = "") -> str:
    """'value unit [low, high]' with ``num`` formatting each number; 'n/a' when there is no value."""
    if e is None or e.value is None:
        return "n/a"
    if e.low is None or e.high is None:
        return f"{num(e.value)}{unit}"
    return f"{num(e.value)}{unit} [{num(e.low)}, {num(e.high)}]"


def ms(e: Estimate | None) -> str:
    """Seconds as 'p [low, high]' in milliseconds; 'n/a' when there is no value."""
    return _interval(e, lambda v: f"{v * 1000:.1f}")


def pct(e: Estimate | None) -> str:
    """A rate as 'p% [low%, high%]'; 'n/a' when there is no value."""
    return _interval(e, lambda v: f"{v:.0%}")


def pp(e: Estimate | None) -> str:
    """A difference of rates in percentage points, '+d pp [low, high]'; 'n/a' when there is no value."""
    return _interval(e, lambda v: f"{v * 100:+.0f}", " pp")


def p_value(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def branch_group(report: BranchSummaryArtifact, ks: Sequence[int]) -> Group:
    t = Table(title=f"branch from a prepared state: {report.task}, k={report.k}, {report.substrate} (95% intervals)")
    t.add_column("figure")
    for m in report.methods:
        t.add_column(m.method)
    dims = sorted({d for m in report.methods for d in m.faithful})
    n = max((m.continuations for m in report.methods), default=0)
    rows = [
        ("creation p50, one at a time (ms, restore included)", [ms(m.creation_sequential.p50) for m in report.methods]),
        ("  p95", [ms(m.creation_sequential.p95) for m in report.methods]),
        (f"creation p50, {n} at once (ms)", [ms(m.creation_parallel.p50) for m in report.methods]),
    ]
    if any(m.creation_phases for m in report.methods):
        rows.append(("  its phases p50 (ms)", [_phase_cells(m.creation_phases, cpu=False) for m in report.methods]))
        if any(_phase_cells(m.creation_phases, cpu=True) != "n/a" for m in report.methods):
            rows.append(("  CPU time p50 (ms)", [_phase_cells(m.creation_phases, cpu=True) for m in report.methods]))
    rows += [
        ("hand-over p50, one at a time (ms)", [_handover(m.handover_sequential, m.made_ahead, m.continuations)
                                               for m in report.methods]),
        (f"hand-over p50, {n} at once (ms)", [_handover(m.handover_parallel, m.made_ahead_parallel,
                                                        m.creation_parallel.n) for m in report.methods]),
        ("faithfulness check p50 (capture + compare, ms)", [ms(m.capture.p50) if m.capture else "n/a"
                                                            for m in report.methods]),
        ("prepare, once (ms)", [ms_value(m.prepare_s) for m in report.methods]),
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
    if any(m.nodes for m in report.methods):
        rows += _branch_ray_rows(report)
    for label, cells in rows:
        t.add_row(label, *cells)
    parts: list[RenderableType] = [t]
    for r in report.ratios:
        parts.append(Text(f"{r.method} / {r.baseline} valid continuations per host-hour (end to end): "
                          f"{_times(r.end_to_end)}"))
        parts.append(Text(f"  beside it, {r.baseline} / {r.method} creation time (restore included): "
                          f"{_times(r.creation)}"))
    if not report.ratios and any(m.handover_sequential is None for m in report.methods) and len(report.methods) > 1:
        parts.append(Text("(a ledger written before creation and hand-over were kept apart: its creation is the "
                          "wall time of fork(), for criu the hand-over from its pool; no ratio is given)"))
    parts.append(Text(f"prepared state unchanged afterwards: {report.prepared_unchanged}; isolation positive control "
                      f"{'fired' if report.isolation_control_fired else 'DID NOT FIRE'}; run {report.run_id}"))
    for m in report.methods:
        for problem in m.errors[:3]:
            parts.append(Text(f"{m.method}: {problem}"))
    return Group(*parts)


def _phase_cells(phases: dict[str, Estimate], cpu: bool) -> str:
    """'restore 180.2 [170.1, 230.0], ...': the wall-time phases, or (``cpu``) the CPU times."""
    picked = [(k.removesuffix("_s").removesuffix("_cpu"), e) for k, e in phases.items() if k.endswith("_cpu_s") == cpu]
    return ", ".join(f"{k} {ms(e)}" for k, e in picked) or "n/a"


def _handover(lat: Latency | None, ahead: int, of: int) -> str:
    """The caller's wait p50, and how many were made ahead of demand; 'n/a' for an old ledger."""
    if lat is None:
        return "n/a"
    return ms(lat.p50) + (f" ({ahead} of {of} made ahead)" if ahead else "")


def _times(e: Estimate) -> str:
    """A ratio as '1.9x [1.2, 3.1]' (its method after), 'n/a' when there is none."""
    if e.value is None:
        return "n/a"
    hi = "inf" if e.high is None or math.isinf(e.high) else f"{e.high:.3g}"
    return f"{e.value:.3g}x [{e.low or 0:.3g}, {hi}] ({e.method})"


def _branch_ray_rows(report: BranchSummaryArtifact) -> list[tuple[str, list[str]]]:
    """On Ray: the prepared state's transfer (apart from creation) and where the continuations ran."""
    def per_node(m: BranchMethodArtifact, cell: Callable[[BranchNode], str]) -> str:
        return ", ".join(f"{n.label} {cell(n)}" for n in m.nodes) or "n/a"

    return [
        ("shipped: bytes; pack + put on the driver (ms)",
         [f"{m.shipped_bytes}; {ms_value((m.pack_s or 0) + (m.put_s or 0))}" for m in report.methods]),
        ("transfer to each node (ms, apart from creation)", [per_node(m, lambda n: ms_value(n.transfer_s))
                                                            for m in report.methods]),
        ("unpack on each node (ms)", [per_node(m, lambda n: ms_value(n.unpack_s)) for m in report.methods]),
        ("continuations (faithful) per node", [per_node(m, lambda n: f"{n.continuations} ({n.faithful_all.faithful})")
                                               for m in report.methods]),
        ("creation p50 per node (ms)", [per_node(m, lambda n: ms(n.creation_sequential.p50)) for m in report.methods]),
    ]


def ms_value(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _per_substrate(title: str, results: Sequence[ColdstartArtifact | DesktopColdstartArtifact]) -> Table:
    """A cold-start table: a column of figures, then one column per substrate."""
    t = Table(title=title)
    t.add_column("figure")
    for r in results:
        t.add_column(f"{r.substrate} ({r.isolation})")
    return t


def _floor_cell(r: ColdstartArtifact | DesktopColdstartArtifact) -> str:
    """The raw floor's p50 and the start of its command."""
    return ms(r.floor.p50 if r.floor else None) + (f"  `{' '.join(r.floor_argv)}`"[:40] if r.floor_argv else "")


def coldstart_group(results: Sequence[ColdstartArtifact], mode: str, n: int, idle: int, run_id: str,
                    pools: Sequence[PoolColdstartArtifact | None] = (), of: str = "") -> Group:
    """``of``: what the sandboxes were of when not each substrate's own (a task's image)."""
    t = _per_substrate(f"cold start{' of ' + of if of else ''}, {mode}, n={n} per substrate (ms, 95% intervals)",
                       results)
    rows: list[tuple[str, list[str]]] = [
        ("create -> first command p50", [ms(r.first_command.p50) for r in results]),
        ("  p95", [ms(r.first_command.p95) for r in results]),
        ("  p99", [ms(r.first_command.p99) for r in results]),
        ("raw floor p50", [_floor_cell(r) for r in results]),
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
    by_sub = {p.substrate: p for p in pools if p is not None}
    if by_sub:
        rows += pool_rows([by_sub.get(r.substrate) for r in results], results)
    for label, cells in rows:
        t.add_row(label, *cells)
    notes = [Text(f"run {run_id}; idle memory: the drop of MemAvailable with {idle} idle sandboxes (noisy on "
                  "a busy host), and the PSS of the host processes labelled with the run")]
    if by_sub:
        notes.append(Text("warm pool (docs/pool.md): acquire = a checked sandbox handed out by the pool; sequential "
                          "mode waits for the pool to refill before each acquire; pool cost = its idle sandboxes' "
                          "share of host RAM while held + its background create/check/destroy time at the slot rate"))
        for p in by_sub.values():
            notes += [Text(f"{p.substrate}: {problem}") for problem in p.errors[:3]]
    return Group(t, *notes)


def desktop_coldstart_group(results: Sequence[DesktopColdstartArtifact], mode: str, n: int, run_id: str) -> Group:
    """``coldstart --tasks desktop``: per substrate, a new sandbox to the first good screenshot, the
    sandbox's part of it, the reset per strategy, beside the substrate's raw floor."""
    task = results[0].task if results else "?"
    t = _per_substrate(f"desktop cold start on {task}, {mode}, n={n} per substrate (ms, 95% intervals)", results)
    rows: list[tuple[str, list[str]]] = [
        ("create -> first good screenshot p50", [ms(r.start.p50) for r in results]),
        ("  p95", [ms(r.start.p95) for r in results]),
        ("  of which the sandbox's create p50", [ms(r.create.p50) for r in results]),
        ("raw floor p50 (an empty sandbox)", [_floor_cell(r) for r in results]),
        ("ratio to raw floor (p50)", [f"{r.ratio_to_floor:.1f}" if r.ratio_to_floor else "n/a" for r in results]),
        ("success rate", [r.success.fmt(".3f") for r in results]),
    ]
    for strategy in ("in_place", "recreate"):
        rows.append((f"reset {strategy} -> first good screenshot p50",
                     [ms(r.reset[strategy].p50) if strategy in r.reset else "n/a" for r in results]))
        rows.append(("  p95", [ms(r.reset[strategy].p95) if strategy in r.reset else "n/a" for r in results]))
    for label, cells in rows:
        t.add_row(label, *cells)
    notes = [Text(f"run {run_id}; a start: a new sandbox, Xvfb + openbox + LibreOffice on the task's document, "
                  "until a screenshot shows it drawn and still; a reset: from a running instance to the next "
                  "such screenshot")]
    notes += [Text(f"{r.substrate}: {problem}") for r in results for problem in r.errors[:3]]
    return Group(t, *notes)


def pool_rows(pools: Sequence[PoolColdstartArtifact | None],
              results: Sequence[ColdstartArtifact]) -> list[tuple[str, list[str]]]:
    """The warm pool's rows of the cold-start table, one cell per substrate ('n/a' without a pool)."""

    def cells(f: Callable[[PoolColdstartArtifact], str]) -> list[str]:
        return [f(p) if p is not None else "n/a" for p in pools]

    def mib(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    def speedup(p: PoolColdstartArtifact, r: ColdstartArtifact) -> str:
        a, c = p.acquire_first_command.p50.value, r.first_command.p50.value
        return f"{c / a:.1f}x" if a and c else "n/a"

    return [
        ("warm pool: size", cells(lambda p: str(p.size))),
        ("acquire from pool p50", cells(lambda p: ms(p.acquire.p50))),
        ("  p95", cells(lambda p: ms(p.acquire.p95))),
        ("acquire -> first command p50", cells(lambda p: ms(p.acquire_first_command.p50))),
        ("create -> first command / acquire -> first command",
         [speedup(p, r) if p is not None else "n/a" for p, r in zip(pools, results, strict=True)]),
        ("pool hits / misses / refused", cells(lambda p: f"{p.hits} / {p.misses} / {p.refused}")),
        ("pool: first fill, s", cells(lambda p: "n/a" if p.fill_s is None else f"{p.fill_s:.2f}")),
        ("pool: background create / check mean",
         cells(lambda p: f"{(p.create_mean_s or 0) * 1000:.1f} / {(p.check_mean_s or 0) * 1000:.1f} ms")),
        ("pool idle sandbox, MiB (MemAvailable drop)", cells(lambda p: mib(p.idle_memory_mib_each))),
        ("pool idle sandbox, MiB (PSS)", cells(lambda p: mib(p.idle_pss_mib_each))),
        ("pool cost: holding it, USD/h", cells(lambda p: "n/a" if p.usd_per_hour_held is None
                                                else f"{p.usd_per_hour_held:.2g}")),
        ("pool cost: USD per 1,000 hand-outs", cells(lambda p: "n/a" if p.cost.per_1k_verified is None
                                                      else f"{p.cost.per_1k_verified:.3g}")),
    ]


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


def train_parts(report: Any) -> list[RenderableType]:
    """A ``train`` report (``train.artifact.TrainReport``, read by its fields: the report layer does not
    import ``train``) as rich tables and lines: learning curves, final eval with tests, training cost."""
    curves = Table(title=f"eval success on {len(report.eval_tasks)} clean tasks, mean of {len(report.seeds)} seeds "
                         "[95% t]")
    curves.add_column("iteration", justify="right")
    for c in report.curves:
        curves.add_column(c.treatment)
    for i, pt in enumerate(report.curves[0].points if report.curves else []):
        curves.add_row(str(pt.iteration), *(pct(c.points[i].success) if i < len(c.points) else "n/a"
                                             for c in report.curves))

    final = Table(title="final eval; first-step policy mass")
    for col in ("treatment", "success [t]", "pooled", "P(golden)", "P(sabotage)", "P(tests)"):
        final.add_column(col)
    for f, c in zip(report.finals, report.curves, strict=True):
        last = c.points[-1] if c.points else None
        final.add_row(f.treatment, pct(f.success), f"{f.successes}/{f.valid}",
                      f"{last.mass_golden:.2f}" if last else "n/a", f"{last.mass_sabotage:.2f}" if last else "n/a",
                      f"{last.mass_test:.2f}" if last else "n/a")

    comp = Table(title="final eval difference, paired by seed")
    for col in ("contrast", "difference [95% t]", "p sign-flip", "p Fisher"):
        comp.add_column(col)
    for c in report.comparisons:
        comp.add_row(f"{c.a} - {c.b}", pp(c.difference), p_value(c.p_paired_permutation), p_value(c.p_fisher))

    cost = Table(title=f"training rollouts, {report.fault_mode} faults")
    for col in ("treatment", "attempts", "invalid", "retries", "inv. in loss", "s/valid", "USD/valid",
                "to 90%: seeds, host s"):
        cost.add_column(col)
    for c in report.costs:
        h = c.host_s_to_90
        to90 = f"{c.reached_90}/{len(report.seeds)}" + ("" if h is None or h.value is None else
                                                        f", {h.value:.0f}" + ("" if h.low is None else
                                                                             f" [{h.low:.0f}, {h.high:.0f}]"))
        cost.add_row(c.treatment, str(c.attempts), pct(c.invalid_rate), str(c.retries), str(c.invalid_in_loss),
                     "n/a" if c.s_per_valid_rollout is None else f"{c.s_per_valid_rollout:.3f}",
                     "n/a" if c.usd_per_valid_rollout is None else f"{c.usd_per_valid_rollout:.2e}", to90)
    lines: list[RenderableType] = [f"faults: {report.faults}"]
    lines += [f"{c.treatment}: invalid by cause: " + (", ".join(f"{k} {v}" for k, v in c.invalid.items()) or "none")
              for c in report.costs]
    lines += [f"{c.a} - {c.b}: {c.note}" for c in report.comparisons[:1]]
    lines.append(f"USD at {report.price.usd_per_host_hour:g} per host-hour ({report.price.name}); "
                 "s/valid = host seconds of the treatment's runs per valid training rollout")
    return [curves, final, comp, cost, *lines]


def doctor_table(rows: Sequence[tuple[str, str, str, str, str]]) -> Table:
    """``drumsbench doctor``: per substrate its status, isolation, reset strategies and what to do."""
    t = Table(title="substrates")
    for col in ("substrate", "status", "isolation", "reset", "what to do"):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    return t
