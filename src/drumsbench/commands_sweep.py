"""CLI commands for throughput and cost: ``sweep``, ``project``, and ``--price FILE`` on run/report.

``register(app)`` adds the commands to the main typer app (``cli.py`` calls it once).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from drumsbench.errors import UsageError
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import WHOLE_RUN, stored_price_files

if TYPE_CHECKING:
    from drumsbench.ledger import Ledger
    from drumsbench.measure.cost import HostPrice, PriceFile
    from drumsbench.measure.windows import WindowVerdict

console = Console()
if not console.is_terminal:  # files and pipes: wide enough for the window tables
    console = Console(width=160)
err = Console(stderr=True)

PriceOpt = Annotated[list[Path] | None, typer.Option(
    "--price", help="Price file (TOML or JSON: [owned], [cloud], [cloud_eur], [attribution]); repeatable. "
                    "See examples/prices/.")]


def parse_int_list(text: str, field: str) -> list[int]:
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise UsageError(f"{field}: give a comma-separated list of integers, e.g. 1,2,4,8")
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise UsageError(f"{field}: {p!r} is not an integer; write e.g. 1,2,4,8") from None
    return out


def _duration_or_none(text: str | None, field: str) -> float | None:
    from drumsbench.cli import parse_duration

    if text is None or text.strip().lower() in ("", "0", "0s", "none", "off"):
        return None
    return parse_duration(text, field)


def write_json(data: dict[str, Any], folder: Path, name: str, json_path: Path | None) -> None:
    text = json.dumps(data, indent=2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    if json_path is not None:
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(text)
        except OSError as e:
            raise UsageError(f"--json: cannot write {json_path} ({e.strerror}); choose a writable path") from None


# -- prices on run / report ---------------------------------------------------------------------------

def load_price_files(paths: list[Path] | None) -> list[PriceFile]:
    from drumsbench.measure.cost import load_prices

    return [load_prices(p) for p in paths or []]


def run_price(paths: list[Path] | None) -> HostPrice | None:
    """The first priced host of ``--price`` files, for the run's own headline; validates the files."""
    files = load_price_files(paths)
    return files[0].hosts()[0] if files else None


def remember_prices(ledger: Ledger, run_id: str, paths: list[Path] | None) -> None:
    """Keep the run's price files in its ledger, so ``report`` shows them without ``--price``."""
    files = load_price_files(paths)
    if files:
        artifacts.put(ledger, run_id, "files", artifacts.PriceFilesArtifact(files=files))


def run_costs(ledger: Ledger, run_id: str, report: Any, paths: list[Path] | None,
              data: dict[str, Any], publish: bool = False) -> dict[str, Any]:
    """Print host figures and attribution for a plain run; returns ``data`` with a ``costs`` section.

    The figures are over the whole run (not a confirmed window) and say so; ``publish`` stores them."""
    from drumsbench.experiments.sweep import publish_prices
    from drumsbench.measure.cost import attribute, host_figures
    from drumsbench.measure.windows import usage
    from drumsbench.report.sweep import cost_group

    files = load_price_files(paths)
    if not files:
        files = stored_price_files(ledger, run_id)
    if not files:
        return data
    hosts = [h for f in files for h in f.hosts()]
    figures = host_figures(hosts, report.valid_per_host_hour, report.host_seconds / 3600)
    if publish:
        publish_prices(ledger, run_id, figures, basis=WHOLE_RUN)
    use = usage(ledger, run_id)
    attributions = [attribute(h, f.attribution, use, scope="the whole run") for f in files for h in f.hosts()]
    from rich.console import Group

    console.print(Group(*cost_group(figures, attributions, f"inference: {report.inference_cost}")))
    data["costs"] = {"basis": WHOLE_RUN, "prices": [f.model_dump(mode="json") for f in figures],
                     "attribution": [a.model_dump(mode="json") for a in attributions]}
    return data


# -- sweep ----------------------------------------------------------------------------------------

def sweep(
    substrate: Annotated[str, typer.Option(help="Where sandboxes run (see `drumsbench doctor`).")] = "process",
    tasks: Annotated[str, typer.Option(help="Built-in suite name or a suite folder.")] = "coding",
    policy: Annotated[str, typer.Option(help="oracle, null, noisy, explorer or adversary[:NAME,...].")] = "oracle",
    noisy_p: Annotated[float, typer.Option(help="noisy: probability of the oracle's fix.")] = 0.5,
    explorer_steps: Annotated[int, typer.Option(help="explorer: exploring steps before the fix.")] = 20,
    think_time: Annotated[str, typer.Option(help="Pause before each action, standing for inference.")] = "0s",
    concurrency: Annotated[str, typer.Option(help="Concurrency of each window, increasing.")] = "1,2,4,8,16",
    window: Annotated[str, typer.Option(help="Length of each window (design value 15m).")] = "15m",
    soak: Annotated[str, typer.Option(help="Soak at N_max (design value 60m); 'none' to skip.")] = "60m",
    burst: Annotated[str | None, typer.Option(help="Also run a short burst this long (reported as a burst).")] = None,
    burst_concurrency: Annotated[int | None, typer.Option(help="Burst concurrency (default: the largest N).")] = None,
    invalid_threshold: Annotated[float, typer.Option(help="A window's invalid rate must be at most this.")] = 0.01,
    stability: Annotated[float, typer.Option(help="A window's two halves must agree within this fraction.")] = 0.25,
    min_gain: Annotated[float, typer.Option(help="Keep climbing while throughput gains more than this.")] = 0.05,
    inject: Annotated[str, typer.Option(help="Faults: cause=rate,... e.g. stale_generation=0.05.")] = "",
    inject_at: Annotated[str | None, typer.Option(help="Inject only in the windows at these N, e.g. 2.")] = None,
    step_timeout: Annotated[str, typer.Option(help="Per-step timeout.")] = "30s",
    episode_timeout: Annotated[str, typer.Option(help="Per-episode timeout.")] = "300s",
    reset: Annotated[str, typer.Option(help="auto, in_place or recreate.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for policies and fault draws.")] = 0,
    price: PriceOpt = None,
    out: Annotated[Path, typer.Option(help="Folder of the ledger and reports.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress as it goes.")] = True,
) -> None:
    """Confirmed windows at rising concurrency: N_max, a soak at N_max, bursts, USD per valid rollout."""
    from drumsbench.cli import _validation, parse_duration, progress_lines
    from drumsbench.envs import suites
    from drumsbench.experiments.run import RunConfig, make_substrate, new_run_id, open_ledger
    from drumsbench.experiments.sweep import SweepConfig, build, publish, run_sweep
    from drumsbench.faults import FaultPlan
    from drumsbench.machine import commit, machine_info
    from drumsbench.policies.scripted import make_policy
    from drumsbench.report.sweep import print_sweep
    from drumsbench.rollout import RolloutConfig
    from drumsbench.substrates.base import ResetStrategy

    flags = {"concurrency": "--concurrency", "window_s": "--window", "soak_s": "--soak", "burst_s": "--burst",
             "burst_concurrency": "--burst-concurrency", "invalid_threshold": "--invalid-threshold",
             "stability": "--stability", "min_gain": "--min-gain", "noisy_p": "--noisy-p",
             "explorer_steps": "--explorer-steps", "think_time_s": "--think-time",
             "step_timeout_s": "--step-timeout", "episode_timeout_s": "--episode-timeout"}
    if reset not in ("auto", "in_place", "recreate"):
        raise UsageError(f"--reset: {reset!r} is not one of auto, in_place, recreate")
    levels = parse_int_list(concurrency, "--concurrency")
    window_s = parse_duration(window, "--window")
    soak_s = _duration_or_none(soak, "--soak")
    burst_s = _duration_or_none(burst, "--burst")
    at = parse_int_list(inject_at, "--inject-at") if inject_at is not None else None
    prices = load_price_files(price)
    try:
        rollout = RolloutConfig(
            step_timeout_s=parse_duration(step_timeout, "--step-timeout"),
            episode_timeout_s=parse_duration(episode_timeout, "--episode-timeout"),
            think_time_s=0.0 if think_time.strip() in ("0", "0s") else parse_duration(think_time, "--think-time"),
            reset=None if reset == "auto" else ResetStrategy(reset))
        extra = {"price": prices[0].hosts()[0]} if prices else {}
        base = RunConfig(substrate=substrate, tasks=tasks, policy=policy, noisy_p=noisy_p,
                         explorer_steps=explorer_steps, concurrency=1, duration_s=window_s, inject=inject,
                         seed=seed, rollout=rollout, **extra)
        cfg = SweepConfig(base=base, concurrency=levels, window_s=window_s, soak_s=soak_s, burst_s=burst_s,
                          burst_concurrency=burst_concurrency, invalid_threshold=invalid_threshold,
                          stability=stability, min_gain=min_gain, inject_at=at, prices=prices)
    except ValidationError as e:
        raise _validation(e, flags) from None
    FaultPlan.parse(cfg.base.inject)
    make_policy(policy, noisy_p, explorer_steps)
    suites.load(tasks)
    ledger = open_ledger(out)
    run_id = new_run_id()
    make_substrate(substrate, run_id, tasks)
    ledger.create_run(run_id, "sweep", cfg.model_dump(mode="json"), machine_info(), commit())
    planned = len(levels) * window_s + (soak_s or 0) + (burst_s or 0)
    err.print(f"sweep {run_id}: {substrate}, {tasks}, policy {policy}, N in {levels}, windows of {window_s:g} s"
              f"{f', soak {soak_s:g} s' if soak_s else ''}{f', burst {burst_s:g} s' if burst_s else ''} "
              f"(at most {planned:g} s); ledger {ledger.path}")

    with progress_lines(progress) as say:
        def started(label: str, n: int, seconds: float) -> None:
            say(f"  window {label}: N={n} for {seconds:g} s ...")

        def finished(v: WindowVerdict) -> None:
            say(f"  window {v.label}: {v.attempts} attempts, {v.valid_per_host_hour.fmt('.4g')} valid/host-h -> "
                f"{v.verdict_line()}")

        status = run_sweep(ledger, run_id, cfg, on_window=finished, on_start=started)
    report = build(ledger, run_id)
    publish(ledger, run_id, report)
    print_sweep(report, console)
    write_json(report.dump(), out / run_id, "sweep-report.json", json_path)
    if status == "interrupted":
        err.print("interrupted: the window that was cut short is not confirmed; the report above is final")
        raise typer.Exit(130)


def special_report(ledger: Ledger, run_id: str, out: Path, json_path: Path | None,
                   price: list[Path] | None) -> bool:
    """``drumsbench report`` for a sweep, projection, branch, coldstart or isolation run; False for
    other kinds. Reads the ledger only. A sweep or projection run whose configuration is not the
    command's (e.g. written by another tool under the same kind) gets the plain run report."""
    from drumsbench.experiments.project import ProjectConfig
    from drumsbench.experiments.sweep import SweepConfig

    run = ledger.run(run_id)
    kind = run["kind"]
    if kind in ("branch", "coldstart", "isolation"):
        return _experiment_report(ledger, run_id, kind, out, json_path)
    models: dict[str, type[BaseModel]] = {"sweep": SweepConfig, "project": ProjectConfig}
    model = models.get(kind)
    if model is None:
        return False
    try:
        model.model_validate(run["config"])
    except (ValidationError, UsageError):
        return False
    if kind == "sweep":
        from drumsbench.experiments.sweep import build
        from drumsbench.report.sweep import print_sweep

        files = load_price_files(price)
        report = build(ledger, run_id, prices=files or None)
        print_sweep(report, console)
        write_json(report.dump(), out / run_id, "sweep-report.json", json_path)
        return True
    from drumsbench.experiments.project import build as build_projection
    from drumsbench.report.sweep import projection_group

    cfg = ProjectConfig.model_validate(ledger.run(run_id)["config"])
    proj = build_projection(ledger, [run_id], cfg.trajectories, cfg.steps, cfg.tolerance, cfg.seed)
    console.print(projection_group(proj))
    write_json(proj.dump(), out / run_id, "projection.json", json_path)
    return True


def _experiment_report(ledger: Ledger, run_id: str, kind: str, out: Path, json_path: Path | None) -> bool:
    """The report of a branch, coldstart or isolation run, from its stored artifacts alone."""
    from drumsbench.report.tables import branch_group, coldstart_group, isolation_group

    arts = artifacts.load_run(ledger, run_id)
    if arts.errors:
        raise UsageError(f"{run_id}: {next(iter(arts.errors.values()))}; rerun the command with this version")
    config = ledger.run(run_id)["config"]
    if kind == "branch":
        if arts.branch_summary is None:
            raise UsageError(f"{run_id}: the branch run has no summary (it did not finish); rerun `drumsbench branch`")
        console.print(branch_group(arts.branch_summary, config.get("ks", [])))
        write_json(arts.branch_summary.model_dump(mode="json", by_alias=True), out / run_id, "branch-report.json",
                   json_path)
    elif kind == "coldstart":
        results = list(arts.coldstart.values())
        console.print(coldstart_group(results, str(config.get("mode")), int(config.get("n", 0)),
                                      int(config.get("idle", 0)), run_id))
        write_json({"schema": "drumsbench.coldstart/2", "run_id": run_id, "config": config,
                    "results": [r.model_dump(mode="json") for r in results]}, out / run_id, "coldstart.json", json_path)
    else:
        probes = list(arts.isolation.values())
        console.print(isolation_group(probes))
        write_json({"schema": "drumsbench.isolation/3", "run_id": run_id,
                    "substrates": {r.substrate: r.model_dump(mode="json") for r in probes}},
                   out / run_id, "isolation.json", json_path)
    return True


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command()(project)


# -- project -------------------------------------------------------------------------------------

def project(
    trajectories: Annotated[int, typer.Option(help="Trajectories to project.")] = 1_000_000,
    steps: Annotated[int, typer.Option(help="Steps per trajectory.")] = 150,
    from_runs: Annotated[list[str] | None, typer.Option(
        "--from", help="Measure from these runs (in --out); repeatable. Without it, calibrate here.")] = None,
    substrate: Annotated[list[str] | None, typer.Option(
        help="Substrate to calibrate, optionally with its reset: process, process:recreate; repeatable.")] = None,
    tasks: Annotated[str, typer.Option(help="Task suite for calibration and check.")] = "coding",
    calibrate_attempts: Annotated[int, typer.Option(help="Calibration trajectories per substrate.")] = 12,
    calibrate_steps: Annotated[int, typer.Option(help="Exploring steps of a calibration trajectory.")] = 30,
    check: Annotated[int, typer.Option(help="Also run this many real trajectories of --steps steps and compare.")] = 0,
    tolerance: Annotated[float, typer.Option(help="The check passes when projected is within this of measured.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed for bootstrap and policies.")] = 0,
    out: Annotated[Path, typer.Option(help="Folder of the ledger and reports.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON projection here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress as it goes.")] = True,
) -> None:
    """Worker-hours for N trajectories of S steps per substrate, from measured phase times."""
    from drumsbench.cli import _validation, progress_lines
    from drumsbench.experiments.project import ProjectConfig, Target, build, publish, run_projection
    from drumsbench.experiments.run import ledger_path, make_substrate, new_run_id, open_ledger
    from drumsbench.ledger import Ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.report.sweep import projection_group

    flags = {"trajectories": "--trajectories", "steps": "--steps", "calibrate_attempts": "--calibrate-attempts",
             "calibrate_steps": "--calibrate-steps", "check": "--check", "tolerance": "--tolerance",
             "targets": "--substrate"}
    if from_runs and (substrate or check):
        raise UsageError("--from measures earlier runs; --substrate and --check calibrate here: give one or the other")
    if from_runs:
        if not ledger_path(out).exists():
            raise UsageError(f"--out: no ledger at {ledger_path(out)}; give the folder the runs wrote to")
        try:
            ProjectConfig(trajectories=trajectories, steps=steps, tolerance=tolerance)
        except ValidationError as e:
            raise _validation(e, flags) from None
        ledger = Ledger(ledger_path(out))
        runs = list(from_runs)
        name = f"projection-{'-'.join(runs)[:60]}.json"
    else:
        try:
            targets = [Target.parse(s) for s in (substrate or ["process"])]
            cfg = ProjectConfig(trajectories=trajectories, steps=steps, targets=targets, tasks=tasks,
                                calibrate_attempts=calibrate_attempts, calibrate_steps=calibrate_steps, check=check,
                                tolerance=tolerance, seed=seed)
        except ValidationError as e:
            raise _validation(e, flags) from None
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
