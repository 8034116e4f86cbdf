"""``drumsbench chaos``: a run under events injected from outside the harness, then its checks."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, names, parse_duration, progress_lines, usage_error

FLAGS = {"every_s": "--every", "hold_s": "--hold", "tmpfs_mib": "--tmpfs-mib", "kinds": "--events"}


def chaos(
    substrate: o.Substrate = "process",
    tasks: o.Tasks = "coding",
    policy: o.Policy = "oracle",
    concurrency: o.Concurrency = None,
    duration: o.Duration = "60s",
    every: Annotated[str, typer.Option(help="Mean time between events (each gap drawn from 0.5x to 1.5x).")] = "10s",
    events: Annotated[list[str] | None, typer.Option(
        "--events", metavar="KIND[,KIND...]",
        help="Kinds of event: harness_kill, sandbox_kill, container_kill, desktop_kill, vm_kill, ledger_reader, "
             "disk_full (default: every kind that applies), and daemon_kill (docker: kills and restarts the "
             "machine's dockerd; only when named).")] = None,
    hold: Annotated[str, typer.Option(help="How long a reader holds the ledger and a disk stays full.")] = "3s",
    tmpfs_mib: Annotated[int | None, typer.Option(help="Run with the out folder on a tmpfs of this many MiB "
                                                       "(needs root); enables disk_full.")] = None,
    step_timeout: o.StepTimeout = "30s",
    episode_timeout: o.EpisodeTimeout = "300s",
    seed: o.Seed = 0,
    out: o.Out = o.RUNS,
    check: Annotated[str | None, typer.Option(help="Only check this finished chaos run again from its ledger "
                                                   "in --out.")] = None,
    progress: o.Progress = True,
) -> None:
    """A run under injected events (kills, a held ledger, a full disk); checks nothing was lost."""
    from drumsbench.experiments.chaos import Chaos, ChaosConfig, check_only

    if check is not None:
        run_id, summary = check, check_only(out, check)
    else:
        try:
            extra = {} if concurrency is None else {"concurrency": concurrency}
            cfg = ChaosConfig(substrate=substrate, tasks=tasks, policy=policy, **extra,
                              duration_s=parse_duration(duration, "--duration"),
                              every_s=parse_duration(every, "--every"), seed=seed, kinds=names(events),
                              hold_s=parse_duration(hold, "--hold"), tmpfs_mib=tmpfs_mib,
                              step_timeout_s=parse_duration(step_timeout, "--step-timeout"),
                              episode_timeout_s=parse_duration(episode_timeout, "--episode-timeout"))
        except ValidationError as e:
            raise usage_error(e, FLAGS) from None
        with progress_lines(progress) as say:
            run_id, summary = Chaos(cfg, out, say).execute()
    from drumsbench.report.chaos import print_chaos

    print_chaos(run_id, summary, console)
    if not summary.passed:
        raise typer.Exit(1)
