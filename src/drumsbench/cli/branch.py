"""``drumsbench branch``: continuations from a prepared live state, judged per fork method."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import (
    console,
    finishing,
    names,
    one_suite,
    parse_duration,
    parse_int_list,
    progress_lines,
    usage_error,
    write_json,
)

if TYPE_CHECKING:
    from drumsbench.measure.artifacts import BranchSummaryArtifact


def branch_json(summary: BranchSummaryArtifact) -> dict[str, Any]:
    """``branch-report.json``: the stored summary as it is."""
    return summary.model_dump(mode="json", by_alias=True)


def branch(
    tasks: o.Tasks = "coding",
    env: o.EnvAlias = None,
    task: o.Task = None,
    substrate: o.Substrate = "process",
    k: Annotated[int, typer.Option(help="Actions before the branch point.")] = 5,
    ks: Annotated[str | None, typer.Option(
        help="k values for the creation-time-against-k table (default 1,5,20; with --executor ray: k).")] = None,
    continuations: Annotated[int, typer.Option(help="Continuations per method.")] = 16,
    methods: Annotated[str, typer.Option(
        help="Fork methods: replay, file, snapshot, criu (a pool restored ahead), criu-cold.")] = "replay,file",
    policy: Annotated[str, typer.Option(help="Policy that continues each continuation.")] = "noisy",
    step_timeout: o.StepTimeout = "30s",
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
    executor: Annotated[str, typer.Option(
        help="local (this host) or ray (continuations made, checked and run on the cluster's nodes).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="ray: auto or HOST:PORT to join; none: a local Ray.")] = None,
) -> None:
    """Prepare k steps, fork continuations with each method, check faithfulness, run them to the end."""
    from drumsbench.core import host_state as state
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.executors.ray import executor_options
    from drumsbench.experiments.branch import BranchConfig, method_problems, ray_problems, run_branch
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.report.tables import branch_group
    from drumsbench.rollout.attempt import RolloutConfig

    suite = one_suite(tasks, env)
    step = parse_duration(step_timeout, "--step-timeout")
    extra = executor_options(executor, ray_address)  # one-line errors for --executor / --ray-address
    k_values = parse_int_list(ks, "--ks") if ks is not None else [k] if executor == "ray" else [1, 5, 20]
    try:
        cfg = BranchConfig(tasks=suite, task=task, substrate=substrate, k=k, ks=k_values,
                           continuations=continuations, methods=names(methods), policy=policy,
                           rollout=RolloutConfig(step_timeout_s=step, episode_timeout_s=step * 10), **extra)
    except ValidationError as e:
        raise usage_error(e, {"tasks": "--tasks"}) from None
    from drumsbench.branching.methods import METHODS
    from drumsbench.policies.scripted import make_policy

    make_policy(cfg.policy)
    for name in cfg.methods:
        METHODS.load(name)  # a one-line error naming the known methods
    from drumsbench.substrates import registry

    ray_problems(cfg, registry.get(substrate))
    from drumsbench.envs import suites

    method_problems(cfg, registry.get(substrate), suites.load(cfg.tasks).make_env)
    run_id = new_run_id()
    sub = make_substrate(substrate, run_id, suite)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "branch", cfg.model_dump(mode="json"), machine_info(), commit())
    state.register(run_id, [substrate], ledger.path)  # a crash leaves sandboxes, continuations, exports for gc
    try:
        with finishing(ledger, run_id, [sub]), progress_lines(progress) as say:
            report = run_branch(cfg, sub, ledger, run_id, say=say)
    finally:
        state.unregister(run_id)
    console.print(branch_group(report, cfg.ks))
    write_json(branch_json(report), out / run_id, "branch-report.json", json_path)
