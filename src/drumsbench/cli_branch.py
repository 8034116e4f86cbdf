"""``drumsbench branch``: continuations from a prepared live state, judged per fork method."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from drumsbench import commands_sweep as cs
from drumsbench.cli import app, console, parse_duration, progress_lines, usage_error
from drumsbench.errors import UsageError


def _ints(text: str, field: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{field}: {text!r} is not a comma-separated list of whole numbers, e.g. 1,5,20") from None


@app.command()
def branch(
    env: Annotated[str, typer.Option("--tasks", "--env", help="Task suite (coding, desktop or a folder).")] = "coding",
    task: Annotated[str | None, typer.Option(help="Task id (default: the suite's first).")] = None,
    substrate: Annotated[str, typer.Option(help="Where sandboxes run.")] = "process",
    k: Annotated[int, typer.Option(help="Actions before the branch point.")] = 5,
    ks: Annotated[str, typer.Option(help="k values for the creation-time-against-k table.")] = "1,5,20",
    continuations: Annotated[int, typer.Option(help="Continuations per method.")] = 16,
    methods: Annotated[str, typer.Option(help="Fork methods: replay, file, snapshot, criu.")] = "replay,file",
    policy: Annotated[str, typer.Option(help="Policy that continues each continuation.")] = "noisy",
    step_timeout: Annotated[str, typer.Option(help="Per-step timeout.")] = "30s",
    out: Annotated[Path, typer.Option(help="Folder of the ledger.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress as it goes.")] = True,
) -> None:
    """Prepare k steps, fork continuations with each method, check faithfulness, run them to the end."""
    from drumsbench.experiments.branch import BranchConfig, run_branch
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.rollout import RolloutConfig

    step = parse_duration(step_timeout, "--step-timeout")
    try:
        cfg = BranchConfig(tasks=env, task=task, substrate=substrate, k=k, ks=_ints(ks, "--ks"),
                           continuations=continuations, methods=[m.strip() for m in methods.split(",") if m.strip()],
                           policy=policy, rollout=RolloutConfig(step_timeout_s=step, episode_timeout_s=step * 10))
    except ValidationError as e:
        raise usage_error(e, {"tasks": "--tasks"}) from None
    from drumsbench.branching.methods import METHODS
    from drumsbench.policies.scripted import make_policy

    make_policy(cfg.policy)
    for name in cfg.methods:
        METHODS.load(name)  # a one-line error naming the known methods
    run_id = new_run_id()
    sub = make_substrate(substrate, run_id, env)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "branch", cfg.model_dump(mode="json"), machine_info(), commit())
    try:
        with progress_lines(progress) as say:
            report = run_branch(cfg, sub, ledger, run_id, say=say)
        ledger.set_status(run_id, "complete")
    finally:
        sub.close()

    from drumsbench.report.tables import branch_group

    console.print(branch_group(report, cfg.ks))
    cs.write_json(report.model_dump(mode="json", by_alias=True), out / run_id, "branch-report.json", json_path)
