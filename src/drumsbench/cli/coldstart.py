"""``drumsbench coldstart``: substrates side by side, each beside its raw floor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import (
    console,
    finishing,
    one_suite,
    progress_lines,
    substrate_names,
    usage_error,
    write_json,
)

if TYPE_CHECKING:
    from drumsbench.envs.base import Task
    from drumsbench.measure.artifacts import ColdstartArtifact, DesktopColdstartArtifact
    from drumsbench.measure.pool import PoolColdstartArtifact

TaskT = TypeVar("TaskT", bound="Task")


def _chosen_task(tasks: Sequence[TaskT], wanted: str | None, suite: str) -> TaskT:
    """``--task``'s task of ``suite`` (the first when none is named); a one-line ``UsageError`` naming
    some of the others when it has none of that id."""
    from drumsbench.core.errors import UsageError

    by_id = {t.id: t for t in tasks}
    found = by_id.get(wanted or next(iter(by_id)))
    if found is None:
        raise UsageError(f"--task: no task {wanted!r} in {suite}; one of {', '.join(list(by_id)[:20])}")
    return found


def coldstart_json(run_id: str, config: dict[str, Any], results: Sequence[ColdstartArtifact],
                   pools: Sequence[PoolColdstartArtifact] = (),
                   desktop: Sequence[DesktopColdstartArtifact] = ()) -> dict[str, Any]:
    """``coldstart.json``; ``pools``: the warm pool per substrate (``pool``, absent without one);
    ``desktop``: ``--tasks desktop``'s results (``desktop``, absent for the coding sandbox)."""
    return {"schema": "drumsbench.coldstart/2", "run_id": run_id, "config": config,
            "results": [r.model_dump(mode="json") for r in results],
            **({"pool": [p.model_dump(mode="json") for p in pools]} if pools else {}),
            **({"desktop": [d.model_dump(mode="json") for d in desktop]} if desktop else {})}


def coldstart(
    substrate: o.Substrates = None,
    substrates: o.SubstratesAlias = None,
    mode: Annotated[str, typer.Option(help="sequential, staggered or burst.")] = "sequential",
    n: Annotated[int, typer.Option("-n", help="Sandboxes per substrate.")] = 100,
    stagger: Annotated[float, typer.Option(help="staggered: seconds between starts.")] = 0.05,
    idle: Annotated[int, typer.Option(help="Idle sandboxes for the memory figure.")] = 8,
    reset_n: Annotated[int, typer.Option(help="Resets per strategy.")] = 10,
    pool: Annotated[str, typer.Option("--pool", metavar="auto|off|N", help=(
        "Also measure acquire from a warm pool of this many sandboxes (auto: one per core; off: not "
        "measured)."))] = "auto",
    tasks: o.Tasks = "coding",
    env: o.EnvAlias = None,
    task: o.Task = None,
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
) -> None:
    """Cold start, teardown, idle memory and reset per substrate, beside each one's raw floor; with a
    desktop suite (--tasks desktop): the desktop's start to its first good screenshot of --task's
    document, and its resets."""
    from drumsbench.core import host_state as state
    from drumsbench.core.errors import UsageError
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.envs import suites
    from drumsbench.envs.coding.task import load_suite
    from drumsbench.envs.harbor.env import HarborEnv
    from drumsbench.experiments.coldstart import ColdstartConfig, measure, measure_desktop, measure_pool
    from drumsbench.experiments.run import images_problem, make_substrate, new_run_id, open_ledger
    from drumsbench.measure import artifacts
    from drumsbench.report.tables import coldstart_group, desktop_coldstart_group
    from drumsbench.rollout.pool import parse_pool
    from drumsbench.substrates.base import RecipeImages

    chosen = substrate_names(substrate, substrates)
    try:
        cfg = ColdstartConfig(substrates=chosen, mode=mode, n=n, stagger_s=stagger, idle=idle, reset_n=reset_n,
                              pool=parse_pool(pool))
    except ValidationError as e:
        raise usage_error(e, {"stagger_s": "--stagger", "substrates": "--substrate", "n": "-n"}) from None
    suite = one_suite(tasks, env)
    desktop_task = harbor_task = None
    kind = suites.suite_kind(suite)  # a one-line error for an unknown suite
    if kind == "desktop":
        from drumsbench.envs.desktop.task import load_suite as load_desktop

        desktop_task = _chosen_task(load_desktop(suite), task, suite)
    if kind == "harbor":  # the real image of one task: its sandboxes, its floor
        from drumsbench.envs.harbor.task import load_suite as load_harbor

        harbor_task = _chosen_task(load_harbor(suites.split(suite)[1]), task, suite)
        for name in chosen:
            problem = images_problem(HarborEnv, name)
            if problem:
                raise UsageError(problem)
    run_id = new_run_id()
    # the desktop's needs are checked per substrate before anything runs (the vm is refused up front)
    subs = [make_substrate(name, run_id, suite if desktop_task else None) for name in chosen]
    ledger = open_ledger(out)
    config = {**cfg.model_dump(mode="json"), "tasks": suite,
              **({"task": desktop_task.id} if desktop_task else {}),
              **({"task": harbor_task.id} if harbor_task else {})}
    ledger.create_run(run_id, "coldstart", config, machine_info(), commit())
    files = load_suite("coding")[0].files
    results = []
    pools: list[PoolColdstartArtifact] = []
    desktop: list[DesktopColdstartArtifact] = []
    state.register(run_id, chosen, ledger.path)  # a crash leaves sandboxes (pooled ones too) that gc can find
    try:
        with finishing(ledger, run_id, subs), progress_lines(progress) as say:
            for sub in subs:
                if desktop_task is not None:
                    d = measure_desktop(sub, cfg, desktop_task, say=say)
                    artifacts.put(ledger, run_id, sub.name, d)
                    desktop.append(d)
                    sub.close()
                    continue
                image = None
                if harbor_task is not None:
                    assert isinstance(sub, RecipeImages)
                    say(f"{sub.name}: the image of {harbor_task.id} (built once, then cached)")
                    image = sub.build_recipe(harbor_task.start_recipe)
                r = measure(sub, cfg, {} if image else files, say=say, image=image)
                artifacts.put(ledger, run_id, sub.name, r)
                results.append(r)
                if cfg.pool_size() and image is None:  # a warm pool holds the substrate's own sandboxes
                    p = measure_pool(sub, cfg, say=say)
                    artifacts.put(ledger, run_id, sub.name, p)
                    pools.append(p)
                sub.close()
    finally:
        state.unregister(run_id)
    if desktop:
        console.print(desktop_coldstart_group(desktop, cfg.mode, cfg.n, run_id))
    else:
        console.print(coldstart_group(results, cfg.mode, cfg.n, cfg.idle, run_id, pools,
                                      of=f"task {harbor_task.id}'s image" if harbor_task else ""))
    write_json(coldstart_json(run_id, config, results, pools, desktop), out / run_id, "coldstart.json", json_path)
