"""``drumsbench project``: worker-hours for N trajectories of S steps per substrate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, err, progress_lines, substrate_names, usage_error, write_json
from drumsbench.core.errors import UsageError

FLAGS = {"targets": "--substrate"}  # the other fields' flags are --field-name


def project(
    trajectories: Annotated[int, typer.Option(help="Trajectories to project.")] = 1_000_000,
    steps: Annotated[int, typer.Option(help="Steps per trajectory.")] = 150,
    from_runs: Annotated[list[str] | None, typer.Option(
        "--from", help="Measure from these runs (in --out); repeatable. Without it, calibrate here.")] = None,
    substrate: Annotated[list[str] | None, typer.Option(
        "--substrate", metavar="NAME[:RESET][,...]",
        help="Substrates to calibrate, each optionally with its reset (process, process:recreate): "
             "repeatable and/or comma-separated (default: process).")] = None,
    substrates: o.SubstratesAlias = None,
    tasks: Annotated[str, typer.Option("--tasks", help="Task suite for calibration and check.")] = "coding",
    calibrate_attempts: Annotated[int, typer.Option(help="Calibration trajectories per substrate.")] = 12,
    calibrate_steps: Annotated[int, typer.Option(help="Exploring steps of a calibration trajectory.")] = 30,
    check: Annotated[int, typer.Option(help="Also run this many real trajectories of --steps steps and compare.")] = 0,
    policy: Annotated[str, typer.Option(
        "--policy", metavar="explorer|realistic",
        help="Trajectories of calibration and check: explorer (exploring steps, then the fix) or realistic "
             "(the realistic agent's reads and test runs on made tasks; --calibrate-steps and --steps are its "
             "whole episode).")] = "explorer",
    tolerance: Annotated[float, typer.Option(help="The check passes when projected is within this of measured.")] = 0.2,
    pool: Annotated[str, typer.Option(
        "--pool", metavar="off|auto|N[,...]",
        help="Warm pool of each calibrated substrate: off, auto (one per concurrent attempt) or N; a comma list "
             "calibrates each substrate with each, side by side (e.g. off,auto). Default: off.")] = "off",
    seed: o.Seed = 0,
    out: o.Out = o.RUNS,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON projection here.")] = None,
    progress: o.Progress = True,
) -> None:
    """Worker-hours for N trajectories of S steps per substrate, from measured phase times."""
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.experiments.project import ProjectConfig, Target, build, publish, run_projection
    from drumsbench.experiments.run import ledger_path, make_substrate, new_run_id, open_ledger
    from drumsbench.ledger import Ledger
    from drumsbench.report.sweep import projection_group
    from drumsbench.rollout.pool import parse_pool

    calibrate = bool(substrate or substrates)
    if from_runs and (calibrate or check):
        raise UsageError("--from measures earlier runs; --substrate and --check calibrate here: give one or the other")
    if from_runs:
        if not ledger_path(out).exists():
            raise UsageError(f"--out: no ledger at {ledger_path(out)}; give the folder the runs wrote to")
        try:
            ProjectConfig(trajectories=trajectories, steps=steps, tolerance=tolerance)
        except ValidationError as e:
            raise usage_error(e, FLAGS) from None
        ledger = Ledger(ledger_path(out))
        runs = list(from_runs)
        name = f"projection-{'-'.join(runs)[:60]}.json"
    else:
        try:
            pools = [parse_pool(p) for p in pool.split(",") if p.strip()] or [0]
            if len(set(pools)) != len(pools):
                raise UsageError(f"--pool {pool}: each setting at most once")
            targets = [Target.parse(s, p) for s in substrate_names(substrate, substrates) for p in pools]
            cfg = ProjectConfig(trajectories=trajectories, steps=steps, targets=targets, tasks=tasks,
                                calibrate_attempts=calibrate_attempts, calibrate_steps=calibrate_steps, check=check,
                                tolerance=tolerance, seed=seed, policy=policy)
        except ValidationError as e:
            raise usage_error(e, FLAGS) from None
        from drumsbench.envs import suites

        suites.load(tasks)
        ledger = open_ledger(out)
        run_id = new_run_id()
        for t in targets:
            make_substrate(t.substrate, run_id, tasks)
        ledger.create_run(run_id, "project", cfg.model_dump(mode="json"), machine_info(), commit())
        err.print(f"project {run_id}: calibrating {', '.join(t.label for t in targets)}; ledger {ledger.path}")
        with progress_lines(progress) as say:
            status = run_projection(ledger, run_id, cfg, on_window=lambda s: say(f"  {s}"))
        if status == "interrupted":
            raise typer.Exit(130)
        runs = [run_id]
        name = "projection.json"
    report = build(ledger, runs, trajectories, steps, tolerance, seed)
    if not from_runs:
        publish(ledger, runs[0], report)
    console.print(projection_group(report))
    write_json(report.dump(), out / runs[0], name, json_path)
