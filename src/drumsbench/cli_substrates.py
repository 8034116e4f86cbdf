"""Commands that compare substrates: ``coldstart`` and ``isolation``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from drumsbench import commands_sweep as cs
from drumsbench.cli import app, console, progress_lines, usage_error
from drumsbench.errors import UsageError


def _substrates(text: str, run_id: str):
    from drumsbench.experiments.coldstart import parse_substrates
    from drumsbench.experiments.run import make_substrate

    return [make_substrate(name, run_id) for name in parse_substrates(text)]


@app.command()
def coldstart(
    substrates: Annotated[str, typer.Option(help="Comma-separated substrates.")] = "process",
    mode: Annotated[str, typer.Option(help="sequential, staggered or burst.")] = "sequential",
    n: Annotated[int, typer.Option("-n", help="Sandboxes per substrate.")] = 100,
    stagger: Annotated[float, typer.Option(help="staggered: seconds between starts.")] = 0.05,
    idle: Annotated[int, typer.Option(help="Idle sandboxes for the memory figure.")] = 8,
    reset_n: Annotated[int, typer.Option(help="Resets per strategy.")] = 10,
    out: Annotated[Path, typer.Option(help="Folder of the ledger and reports.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress as it goes.")] = True,
) -> None:
    """Cold start, teardown, idle memory and reset per substrate, beside each one's raw floor."""
    from pydantic import ValidationError

    from drumsbench.envs.coding.task import load_suite
    from drumsbench.experiments.coldstart import ColdstartConfig, measure
    from drumsbench.experiments.run import new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.measure import artifacts
    from drumsbench.report.tables import coldstart_group

    try:
        cfg = ColdstartConfig(substrates=substrates.split(","), mode=mode, n=n, stagger_s=stagger, idle=idle,
                              reset_n=reset_n)
    except ValidationError as e:
        raise usage_error(e, {"stagger_s": "--stagger", "substrates": "--substrates", "n": "-n"}) from None
    run_id = new_run_id()
    subs = _substrates(substrates, run_id)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "coldstart", cfg.model_dump(mode="json"), machine_info(), commit())
    files = load_suite("coding")[0].files
    results = []
    try:
        with progress_lines(progress) as say:
            for sub in subs:
                r = measure(sub, cfg, files, say=say)
                artifacts.put(ledger, run_id, sub.name, r)
                results.append(r)
                sub.close()
        ledger.set_status(run_id, "complete")
    finally:
        for sub in subs:
            sub.close()
    console.print(coldstart_group(results, cfg.mode, cfg.n, cfg.idle, run_id))
    data = {"schema": "drumsbench.coldstart/2", "run_id": run_id, "config": cfg.model_dump(mode="json"),
            "results": [r.model_dump(mode="json") for r in results]}
    cs.write_json(data, out / run_id, "coldstart.json", json_path)


@app.command()
def isolation(
    substrates: Annotated[str, typer.Option(help="Comma-separated substrates.")] = "process",
    disk_mb: Annotated[int, typer.Option(help="fill_disk: MiB to write (bounded; refused when the host disk "
                                                 "is short).")] = 256,
    procs: Annotated[int, typer.Option(help="fork_bomb: sleeping processes to start (bounded).")] = 300,
    out: Annotated[Path, typer.Option(help="Folder of the ledger and reports.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress as it goes.")] = True,
) -> None:
    """Escape attempts from inside real sandboxes: what each substrate contains.

    Per probe: whether it ran, whether the escape was contained, and whether its positive control
    (the same probe where nothing isolates) fired; "contained" needs a control that fired, else
    the probe is "unconfirmed"; a probe that could not run says "did not run"."""
    from drumsbench.experiments.escape import probe_substrate, run_control
    from drumsbench.experiments.run import new_run_id, open_ledger
    from drumsbench.isolation import positive_control
    from drumsbench.machine import commit, machine_info
    from drumsbench.measure import artifacts
    from drumsbench.report.tables import isolation_group

    if not 1 <= disk_mb <= 4096:
        raise UsageError("--disk-mb: between 1 and 4096")
    if not 1 <= procs <= 2000:
        raise UsageError("--procs: between 1 and 2000")
    run_id = new_run_id()
    subs = _substrates(substrates, run_id)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "isolation", {"substrates": [s.name for s in subs], "disk_mb": disk_mb,
                                            "procs": procs}, machine_info(), commit())
    results: list[artifacts.IsolationArtifact] = []
    try:
        with progress_lines(progress) as say:
            say("positive controls: every probe where nothing isolates")
            control = run_control(disk_mb, procs)
            for sub in subs:
                say(f"{sub.name}: canary positive control and escape probes")
                canary = positive_control(sub)
                ledger.record_control(run_id, sub.name, "isolation", canary.fired, canary.detail)
                probes = probe_substrate(sub, disk_mb, procs, control_results=control)
                r = artifacts.IsolationArtifact(
                    substrate=sub.name, declared=sub.capabilities.isolation.value,
                    canary_control_fired=canary.fired,
                    probes=[artifacts.ProbeArtifact.model_validate(p.as_dict()) for p in probes])
                artifacts.put(ledger, run_id, sub.name, r)
                results.append(r)
                sub.close()
        ledger.set_status(run_id, "complete")
    finally:
        for sub in subs:
            sub.close()
    console.print(isolation_group(results))
    cs.write_json({"schema": "drumsbench.isolation/3", "run_id": run_id,
                   "substrates": {r.substrate: r.model_dump(mode="json") for r in results},
                   "control": [c.as_dict() for c in control]}, out / run_id, "isolation.json", json_path)
