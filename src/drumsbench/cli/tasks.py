"""``drumsbench tasks list|fingerprint|check|make``: task suites."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, cast

import typer

from drumsbench.cli import options as o
from drumsbench.cli.common import console, substrate_names
from drumsbench.core.errors import UsageError


def tasks_list(suite: Annotated[str, typer.Argument(help="Suite name or folder.")] = "coding") -> None:
    """List a suite's tasks (and, for a coding task, who decides its verdicts: judge or in-process)."""
    from drumsbench.envs import suites

    for t in suites.load(suite).tasks:
        trust = getattr(t, "trust", None)
        verdicts = f"[{trust}] " if trust else ""
        console.print(f"{t.id:36} {verdicts}{t.description.splitlines()[0][:80]}", highlight=False, markup=False)


def tasks_fingerprint(suite: Annotated[str, typer.Argument(help="Suite name or folder.")] = "coding") -> None:
    """Print every task's start fingerprint (to update task.toml)."""
    from drumsbench.envs.suites import fingerprints

    for task_id, fp in fingerprints(suite).items():
        console.print(f"{task_id} {fp}")


def tasks_check(
    suite: Annotated[str, typer.Argument(help="Suite name or folder (any environment kind).")] = "coding",
    substrate: o.Substrates = None,
    substrates: o.SubstratesAlias = None,
    task: Annotated[str | None, typer.Option(help="Task for the environment checker (default: the first).")] = None,
    repeat: Annotated[int, typer.Option(
        "--repeat", help="Verify each task's start and golden state this many times; a verdict that changes "
                         "between runs of one state is a flaky task, refused.")] = 5,
) -> None:
    """The environment checker on each substrate (reset and fingerprint, stale actions refused, capture
    round trip, oracle succeeds and null fails, broken observation and verifier classified), then the
    kind's own task checks (coding: every task fails at its start and passes with its golden patch on
    each substrate's image, the same verdict in each of --repeat runs of each state, else it is refused
    as flaky, naming the test). Exit 1 on a problem."""
    import tempfile

    from drumsbench.core.plugins import load_spec
    from drumsbench.envs import suites
    from drumsbench.experiments.envcheck import check_environment
    from drumsbench.experiments.run import images_problem
    from drumsbench.experiments.taskcheck import TaskCheck
    from drumsbench.substrates import registry

    if repeat < 1:
        raise UsageError(f"--repeat: {repeat} runs check nothing; give 1 or more (default 5)")
    kind = suites.KINDS.load(suites.suite_kind(suite))
    loaded = suites.load(suite)
    names = substrate_names(substrate, substrates)
    for n in names:
        problem = images_problem(kind.environment_class(), n)
        if problem:
            raise UsageError(problem)
        missing = registry.get(n).missing()
        if missing:
            raise UsageError(f"--substrate: {n} is not usable here: {missing}")
    chosen = next((t for t in loaded.tasks if t.id == task), None) if task else loaded.tasks[0]
    if chosen is None:
        raise UsageError(f"--task: no task {task!r} in {suite}; `drumsbench tasks list {suite}` shows them")

    solved = "nop fails, solve.sh passes" if kind.name == "harbor" else "the golden patch"

    def show(c: TaskCheck) -> None:
        what = ("data checks" if c.substrate == "host" else
                f"fails on the start state, passes when solved ({solved}; {repeat} runs of each, same verdict); "
                f"verdicts by: {c.trust}")
        if c.ok:
            console.print(f"ok   {c.substrate:8} {c.task}: {what}", highlight=False)
        else:
            # one line however long: a problem is grepped for, never wrapped
            trust = f" (verdicts by: {c.trust})" if c.trust else ""
            console.print(f"FAIL {c.substrate:8} {c.task}: {c.problem}{trust}", highlight=False, soft_wrap=True)

    failures = total = 0
    with tempfile.TemporaryDirectory(prefix="drumsbench-taskcheck-") as tmp:
        for n in names:
            sub = registry.get(n)(f"envcheck-{n}", Path(tmp) / "state")
            try:
                for c in check_environment(loaded.make_env, chosen, sub):
                    total += 1
                    failures += not c.ok
                    console.print(f"{'ok  ' if c.ok else 'FAIL'} {n:8} env {c.check}: {c.detail}", highlight=False)
            finally:
                sub.close()
        if kind.task_checks is not None:
            task_checks = cast(Callable[..., list[TaskCheck]], load_spec(kind.task_checks))
            results = task_checks(suite, names, Path(tmp), progress=show, repeat=repeat)
            total += len(results)
            failures += sum(not c.ok for c in results)
    console.print(f"{total - failures} of {total} checks passed ({kind.name} environment, {', '.join(names)})")
    if failures:
        raise typer.Exit(1)


def tasks_make(
    from_: Annotated[list[str] | None, typer.Option(
        "--from", metavar="NAME==VERSION",
        help="A project pinned in taskgen/projects.toml (repeatable); default: every pinned project.")] = None,
    out: Annotated[Path, typer.Option("--to", help="Folder of the made Harbor task folders (and yield.json); "
                                                   "run them with --tasks harbor:FOLDER.")] = Path("made-tasks"),
    substrate: o.Substrate = "docker",
    max_tasks: Annotated[int, typer.Option("--max-tasks", help="Tasks kept per project at most.")] = 40,
    max_tries: Annotated[int | None, typer.Option(
        "--max-tries", help="Mutations tried per project at most (default: until --max-tasks are kept).")] = None,
    progress: o.Progress = True,
) -> None:
    """Make tasks from real projects' own test suites: each pinned sdist (downloaded once, its digest
    checked), its suite run in a sandbox, then procedural bugs (a flipped comparison, an off-by-one, a
    removed guard, a removed implementation, ...) kept when some of the project's own tests fail on
    them and the rest still pass (FAIL_TO_PASS / PASS_TO_PASS). Writes Harbor task folders and the
    yield table (tried, kept, why dropped); the same pins give byte-identical folders."""
    from drumsbench.cli.common import progress_lines
    from drumsbench.substrates import registry
    from drumsbench.substrates.base import RecipeImages
    from drumsbench.taskgen import make, projects

    if max_tasks < 1:
        raise UsageError(f"--max-tasks: {max_tasks} keeps nothing; give 1 or more")
    if max_tries is not None and max_tries < 1:
        raise UsageError(f"--max-tries: {max_tries} tries nothing; give 1 or more")
    chosen = [projects.find(p) for p in from_] if from_ else projects.load()
    if not issubclass(registry.get(substrate), RecipeImages):
        raise UsageError(f"--substrate: {substrate} cannot build task images (choose "
                         f"{', '.join(registry.having(RecipeImages))})")
    missing = registry.get(substrate).missing()
    if missing:
        raise UsageError(f"--substrate: {substrate} is not usable here: {missing}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--to: {out} is a file; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    sub = registry.get(substrate)("taskgen", out / ".state")
    try:
        with progress_lines(progress) as say:
            yields = make.make(chosen, out, sub, max_tasks, max_tries, say)
    finally:
        sub.close()
        import shutil
        shutil.rmtree(out / ".state", ignore_errors=True)
    console.print(f"{'project':24} {'mutations':>9} {'tried':>6} {'kept':>5}  dropped", highlight=False)
    for y in yields:
        dropped = ", ".join(f"{n} {why}" for why, n in sorted(y.dropped.items())) or "-"
        console.print(f"{y.pin:24} {y.candidates:9} {y.tried:6} {y.kept:5}  {dropped}", highlight=False)
    console.print(f"{sum(y.kept for y in yields)} tasks in {out} (yield table: {out / 'yield.json'}); "
                  f"run them with --tasks harbor:{out}", highlight=False)
