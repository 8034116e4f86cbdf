"""Commands that compare substrates: ``coldstart`` and ``isolation``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from drumsbench.cli import app, console, err
from drumsbench.errors import UsageError


def _substrates(text: str, run_id: str):
    from drumsbench.experiments.coldstart import parse_substrates
    from drumsbench.experiments.run import make_substrate

    return [make_substrate(name, run_id) for name in parse_substrates(text)]


def _ms(e) -> str:
    return "n/a" if e is None or e.value is None else f"{e.value * 1000:.1f} [{e.low * 1000:.1f}, {e.high * 1000:.1f}]"


@app.command()
def coldstart(
    substrates: Annotated[str, typer.Option(help="Comma-separated substrates.")] = "process",
    mode: Annotated[str, typer.Option(help="sequential, staggered or burst.")] = "sequential",
    n: Annotated[int, typer.Option("-n", help="Sandboxes per substrate.")] = 100,
    stagger: Annotated[float, typer.Option(help="staggered: seconds between starts.")] = 0.05,
    idle: Annotated[int, typer.Option(help="Idle sandboxes for the memory figure.")] = 8,
    reset_n: Annotated[int, typer.Option(help="Resets per strategy.")] = 10,
    out: Annotated[Path, typer.Option(help="Folder of the ledger.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
) -> None:
    """Cold start, teardown, idle memory and reset per substrate, beside each one's raw floor."""
    from pydantic import ValidationError

    from drumsbench.envs.coding.task import load_suite
    from drumsbench.experiments.coldstart import ColdstartConfig, measure
    from drumsbench.experiments.run import new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info

    try:
        cfg = ColdstartConfig(substrates=substrates.split(","), mode=mode, n=n, stagger_s=stagger, idle=idle,
                              reset_n=reset_n)
    except ValidationError as e:
        first = e.errors()[0]
        raise UsageError(f"--{str(first['loc'][0]).replace('_s', '').replace('_', '-')}: {first['msg']}") from None
    run_id = new_run_id()
    subs = _substrates(substrates, run_id)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "coldstart", cfg.model_dump(mode="json"), machine_info(), commit())
    files = load_suite("coding")[0].files
    results = []
    try:
        for sub in subs:
            r = measure(sub, cfg, files, say=lambda m: err.print(m))
            ledger.put_artifact(run_id, "coldstart", sub.name, r.model_dump(mode="json"))
            results.append(r)
            sub.close()
        ledger.set_status(run_id, "complete")
    finally:
        for sub in subs:
            sub.close()
    t = Table(title=f"cold start, {cfg.mode}, n={cfg.n} per substrate (ms, 95% intervals)")
    t.add_column("figure")
    for r in results:
        t.add_column(f"{r.substrate} ({r.isolation})")
    rows: list[tuple[str, list[str]]] = [
        ("create -> first command p50", [_ms(r.first_command.p50) for r in results]),
        ("  p95", [_ms(r.first_command.p95) for r in results]),
        ("  p99", [_ms(r.first_command.p99) for r in results]),
        ("raw floor p50", [_ms(r.floor.p50 if r.floor else None) + (f"  `{' '.join(r.floor_argv)}`"[:40]
                                                                   if r.floor_argv else "") for r in results]),
        ("ratio to raw floor (p50)", [f"{r.ratio_to_floor:.2f}" if r.ratio_to_floor else "n/a" for r in results]),
        ("success rate", [r.success.fmt(".3f") for r in results]),
        ("teardown p50", [_ms(r.teardown.p50) for r in results]),
        ("idle sandbox, MiB (MemAvailable drop)", [f"{r.idle_memory_mib:.1f}" if r.idle_memory_mib is not None
                                                   else "n/a" for r in results]),
        ("idle sandbox, MiB (PSS of its processes)", [f"{r.idle_pss_mib:.1f}" if r.idle_pss_mib is not None
                                                      else "n/a (not host-labelled)" for r in results]),
    ]
    for strategy in ("in_place", "recreate"):
        rows.append((f"reset {strategy} p50", [_ms(r.reset[strategy].p50) if strategy in r.reset else "n/a"
                                               for r in results]))
    rows.append(("recreate / in_place", [f"{r.reset_ratio_recreate_over_in_place:.2f}"
                                         if r.reset_ratio_recreate_over_in_place else "n/a" for r in results]))
    for label, cells in rows:
        t.add_row(label, *cells)
    console.print(t)
    console.print(f"run {run_id}; idle memory: the drop of MemAvailable with {cfg.idle} idle sandboxes "
                  "(noisy on a busy "
                  "host), and the PSS of the host processes labelled with the run")
    data = {"schema": "drumsbench.coldstart/1", "run_id": run_id, "config": cfg.model_dump(mode="json"),
            "results": [r.model_dump(mode="json") for r in results]}
    if json_path:
        json_path.write_text(json.dumps(data, indent=2))


@app.command()
def isolation(
    substrates: Annotated[str, typer.Option(help="Comma-separated substrates.")] = "process",
    disk_mb: Annotated[int, typer.Option(help="fill_disk: MiB to write (bounded; refused when the host disk "
                                                 "is short).")] = 256,
    procs: Annotated[int, typer.Option(help="fork_bomb: sleeping processes to start (bounded).")] = 300,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
) -> None:
    """Escape attempts from inside real sandboxes: what each substrate contains.

    Per probe: whether it ran, whether the escape was contained, and whether its positive control
    (the same probe where nothing isolates) fired; "contained" needs a control that fired, else
    the probe is "unconfirmed"; a probe that could not run says "did not run"."""
    from drumsbench.experiments.escape import probe_substrate, run_control
    from drumsbench.experiments.run import new_run_id
    from drumsbench.isolation import positive_control

    if not 1 <= disk_mb <= 4096:
        raise UsageError("--disk-mb: between 1 and 4096")
    if not 1 <= procs <= 2000:
        raise UsageError("--procs: between 1 and 2000")
    run_id = new_run_id()
    control = run_control(disk_mb, procs)
    rows = {}
    for sub in _substrates(substrates, run_id):
        try:
            canary = positive_control(sub)
            rows[sub.name] = {"declared": sub.capabilities.isolation.value, "canary_control_fired": canary.fired,
                              "probes": [p.as_dict() for p in probe_substrate(sub, disk_mb, procs,
                                                                              control_results=control)]}
        finally:
            sub.close()
    t = Table(title="isolation: escape attempts from inside a sandbox (verdict; ran; control)")
    t.add_column("probe")
    for name in rows:
        t.add_column(f"{name} ({rows[name]['declared']})")
    probes = [p["probe"] for p in next(iter(rows.values()))["probes"]] if rows else []
    for i, probe in enumerate(probes):
        cells = []
        for r in rows.values():
            p = r["probes"][i]
            cells.append(f"{p['verdict']}; ran: {'yes' if p['ran'] else 'no'}; "
                         f"contained: {'-' if p['contained'] is None else 'yes' if p['contained'] else 'no'}; "
                         f"control: {p['control']}: {p['detail']}")
        t.add_row(probe, *cells)
    t.add_row("canary positive control", *("fired" if r["canary_control_fired"] else "DID NOT FIRE"
                                            for r in rows.values()))
    console.print(t)
    if json_path:
        json_path.write_text(json.dumps({"schema": "drumsbench.isolation/2", "substrates": rows,
                                         "control": [c.as_dict() for c in control]}, indent=2))
