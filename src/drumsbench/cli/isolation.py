"""``drumsbench isolation``: escape attempts from inside real sandboxes, each beside its positive control."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from drumsbench.cli import options as o
from drumsbench.cli.common import console, finishing, progress_lines, substrate_names, write_json
from drumsbench.core.errors import UsageError

if TYPE_CHECKING:
    from drumsbench.measure.artifacts import IsolationArtifact


def isolation_json(run_id: str, results: Sequence[IsolationArtifact],
                   control: list[dict[str, Any]] | None = None,
                   limits: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``isolation.json`` (the host's positive controls only from the run itself; ``limits``: per
    substrate, its bounds' setting and mechanisms, and with ``--bounds`` the bound probes)."""
    data: dict[str, Any] = {"schema": "drumsbench.isolation/3", "run_id": run_id,
                            "substrates": {r.substrate: r.model_dump(mode="json") for r in results}}
    if control is not None:
        data["control"] = control
    if limits is not None:
        data["limits"] = limits
    return data


BOUNDS_PROBED = (64, 128, 64)  # pids, memory MiB, disk MiB of the ``--bounds`` probes (limits-on run)


def limits_table(limits: dict[str, dict[str, Any]]) -> Any:
    """Per substrate and bound: the mechanism at the run's setting, and the bound probe's verdict."""
    from rich.table import Table

    t = Table(title="bounds per sandbox: mechanism at the setting (DRUMSBENCH_LIMIT_*); with --bounds, the probe "
                    f"at pids {BOUNDS_PROBED[0]}, memory {BOUNDS_PROBED[1]} MiB, disk {BOUNDS_PROBED[2]} MiB, "
                    "limits on vs off")
    t.add_column("substrate")
    for bound in ("pids", "memory_mb", "disk_mb"):
        t.add_column(bound)
    for name, row in limits.items():
        probes = {b["bound"]: b for b in row.get("bounds", [])}
        cells = []
        for bound in ("pids", "memory_mb", "disk_mb"):
            cell = row["mechanisms"].get(bound, "")
            if bound in probes:
                p = probes[bound]
                cell += f"\nprobe: {p['verdict']} (on: {p['on']['detail'][:80]}; off: {p['off']['detail'][:60]})"
            cells.append(cell)
        t.add_row(name, *cells)
    return t


def isolation(
    substrate: o.Substrates = None,
    substrates: o.SubstratesAlias = None,
    disk_mb: Annotated[int, typer.Option(help="fill_disk: MiB to write (bounded; refused when the host disk "
                                              "is short).")] = 256,
    procs: Annotated[int, typer.Option(help="fork_bomb: sleeping processes to start (bounded).")] = 300,
    mem_mb: Annotated[int, typer.Option(help="memory_hog: MiB to allocate and touch (bounded).")] = 256,
    bounds: Annotated[bool, typer.Option(help="Also probe each substrate's pids, memory and disk bounds at small "
                                              "sizes, limits on vs off (the positive control).")] = False,
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
) -> None:
    """Escape attempts from inside real sandboxes: what each substrate contains.

    Per probe: whether it ran, whether the escape was contained, and whether its positive control
    (the same probe where nothing isolates) fired; "contained" needs a control that fired, else
    the probe is "unconfirmed"; a probe that could not run says "did not run"."""
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.experiments.escape import probe_bounds, probe_substrate, run_control
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.measure import artifacts
    from drumsbench.report.tables import isolation_group
    from drumsbench.rollout.isolation import positive_control
    from drumsbench.substrates.base import SandboxLimits

    chosen = substrate_names(substrate, substrates)
    if not 1 <= disk_mb <= 4096:
        raise UsageError("--disk-mb: between 1 and 4096")
    if not 1 <= procs <= 2000:
        raise UsageError("--procs: between 1 and 2000")
    if not 1 <= mem_mb <= 4096:
        raise UsageError("--mem-mb: between 1 and 4096")
    run_id = new_run_id()
    subs = [make_substrate(name, run_id) for name in chosen]
    ledger = open_ledger(out)
    ledger.create_run(run_id, "isolation", {"substrates": [s.name for s in subs], "disk_mb": disk_mb,
                                            "procs": procs, "mem_mb": mem_mb, "bounds": bounds,
                                            "limits": {s.name: asdict(s.limits) for s in subs}},
                      machine_info(), commit())
    results: list[artifacts.IsolationArtifact] = []
    limits: dict[str, dict[str, Any]] = {}
    with finishing(ledger, run_id, subs), progress_lines(progress) as say:
        say("positive controls: every probe where nothing isolates")
        control = run_control(disk_mb, procs, mem_mb=mem_mb)
        for sub in subs:
            say(f"{sub.name}: canary positive control and escape probes")
            canary = positive_control(sub)
            ledger.record_control(run_id, sub.name, "isolation", canary.fired, canary.detail)
            probes = probe_substrate(sub, disk_mb, procs, control_results=control, mem_mb=mem_mb)
            row: dict[str, Any] = {"setting": asdict(sub.limits), "mechanisms": sub.limit_mechanisms()}
            if bounds:
                say(f"{sub.name}: bounds, limits on vs off")
                setting = sub.limits
                sub.limits = SandboxLimits(*BOUNDS_PROBED)
                try:
                    row["bounds"] = [b.as_dict() for b in probe_bounds(sub)]
                finally:
                    sub.limits = setting
            limits[sub.name] = row
            r = artifacts.IsolationArtifact(
                substrate=sub.name, declared=sub.capabilities.isolation.value,
                canary_control_fired=canary.fired,
                probes=[artifacts.ProbeArtifact.model_validate(p.as_dict()) for p in probes])
            artifacts.put(ledger, run_id, sub.name, r)
            results.append(r)
            sub.close()
    console.print(isolation_group(results))
    console.print(limits_table(limits))
    write_json(isolation_json(run_id, results, [c.as_dict() for c in control], limits), out / run_id,
               "isolation.json", json_path)
