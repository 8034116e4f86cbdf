"""``drumsbench report``: any run's report rebuilt from the ledger alone (and the report ``run`` prints)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, err, write_json
from drumsbench.cli.prices import load_price_files, run_costs
from drumsbench.core.errors import UsageError
from drumsbench.measure import artifacts

if TYPE_CHECKING:
    from drumsbench.ledger import Ledger


def report(
    run_ids: Annotated[list[str], typer.Argument(help="Run id(s) (see the ledger); with --html, side by side.")],
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Also write one offline HTML report here.")] = None,
    price: o.Price = None,
) -> None:
    """Rebuild runs' reports from the ledger alone."""
    from drumsbench.experiments.run import ledger_path
    from drumsbench.ledger import Ledger

    if not ledger_path(out).exists():
        raise UsageError(f"--out: no ledger at {ledger_path(out)}; give the folder a run wrote to")
    if json_path is not None and len(run_ids) > 1:
        raise UsageError("--json: the JSON report is one run's; give one run id, or use --html for several")
    ledger = Ledger(ledger_path(out))
    for run_id in run_ids:
        ledger.run(run_id)  # every id known before anything is printed
    reports = {run_id: show_report(ledger, run_id, out, json_path, price) for run_id in run_ids}
    if html_path is not None:
        from drumsbench.report.html import write_html

        write_html(ledger, run_ids, html_path, reports, price_files=load_price_files(price))
        err.print(f"html report: {html_path}")


def show_report(ledger: Ledger, run_id: str, out: Path, json_path: Path | None, price: list[Path] | None = None,
                publish: bool = False) -> Any:
    """Print the run's report and write its JSON (``out/RUN/report.json`` and ``--json``); returns the
    plain run's report (None for the kinds with a report of their own).

    ``publish``: also store the derived price figures in the ledger (the producing command does,
    right after its run); ``drumsbench report`` never writes to the ledger."""
    from drumsbench.measure.summary import build
    from drumsbench.report.terminal import print_report

    load_price_files(price)  # a bad price file is a usage error before anything else
    if _special_report(ledger, run_id, out, json_path, price):  # sweep, project, branch, coldstart, isolation
        return None
    report = build(ledger, run_id)
    print_report(report, console)
    if report.kind == "serve":  # served traffic: who drove the attempts
        from drumsbench.serve.clients import print_clients

        print_clients(ledger, run_id, console)
    watched = _watched_leaks(ledger, run_id)
    if watched:  # run --watch: the leak check of each segment, under the run's report
        data_leaks = {name: v.model_dump(mode="json") for name, v in watched.items()}
        for name, v in watched.items():
            console.print(f"leak check ({name}): {v.detail}", soft_wrap=True, highlight=False)
            for sl in v.slopes:
                console.print(f"  {sl.label}: {sl.fmt()} {sl.unit}/h{'  LEAKS' if sl.leaks else ''}",
                              soft_wrap=True, highlight=False)
    chaos = artifacts.load(ledger, run_id, artifacts.ChaosSummaryArtifact).get("summary")
    if chaos is not None:  # a run driven by `drumsbench chaos`: its checks under the run's report
        from drumsbench.report.chaos import print_chaos

        print_chaos(run_id, chaos, console)
    data = run_costs(ledger, run_id, report, price, report.dump(), publish=publish)
    if watched:
        data["leaks"] = data_leaks
    write_json(data, out / run_id, "report.json", json_path)
    return report


def _watched_leaks(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """The leak verdicts of a ``run --watch`` (empty for a run that was not watched)."""
    from drumsbench.experiments.run import WATCH_PREFIX
    from drumsbench.measure import leaks

    return dict(leaks.judge_watched(artifacts.load(ledger, run_id, artifacts.LeakSamplesArtifact), WATCH_PREFIX))


def _special_report(ledger: Ledger, run_id: str, out: Path, json_path: Path | None,
                    price: list[Path] | None) -> bool:
    """The report of a sweep, projection, branch, coldstart or isolation run; False for other kinds.
    Reads the ledger only. A sweep or projection run whose configuration is not the command's (e.g.
    written by another tool under the same kind) gets the plain run report."""
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
    from drumsbench.cli.branch import branch_json
    from drumsbench.cli.coldstart import coldstart_json
    from drumsbench.cli.isolation import isolation_json
    from drumsbench.report.tables import branch_group, coldstart_group, desktop_coldstart_group, isolation_group

    arts = artifacts.load_run(ledger, run_id)
    if arts.errors:
        raise UsageError(f"{run_id}: {next(iter(arts.errors.values()))}; rerun the command with this version")
    config = ledger.run(run_id)["config"]
    if kind == "branch":
        if arts.branch_summary is None:
            raise UsageError(f"{run_id}: the branch run has no summary (it did not finish); rerun `drumsbench branch`")
        console.print(branch_group(arts.branch_summary, config.get("ks", [])))
        write_json(branch_json(arts.branch_summary), out / run_id, "branch-report.json", json_path)
    elif kind == "coldstart":
        results = list(arts.coldstart.values())
        desktop = list(arts.desktop_coldstart.values())
        if desktop:
            console.print(desktop_coldstart_group(desktop, str(config.get("mode")), int(config.get("n", 0)), run_id))
        else:
            console.print(coldstart_group(results, str(config.get("mode")), int(config.get("n", 0)),
                                          int(config.get("idle", 0)), run_id))
        write_json(coldstart_json(run_id, config, results, desktop=desktop), out / run_id, "coldstart.json",
                   json_path)
    else:
        probes = list(arts.isolation.values())
        console.print(isolation_group(probes))
        write_json(isolation_json(run_id, probes), out / run_id, "isolation.json", json_path)
    return True
