"""``realistic``: a scripted agent that works a made task the way a coding agent does.

For the tasks ``drumsbench tasks make`` writes (Harbor folders whose ``[metadata]`` names the
changed file, ``docs/taskgen.md``), an episode of 20 to 150 steps (drawn per episode):

1. looks around (``ls``, the project's Python files), runs the failing tests the instruction
   lists, reads the test file and the code (``grep`` of definitions, ``sed -n`` of ranges);
2. explores more until its step budget is nearly spent: reads other files of the project in
   ranges, greps identifiers, re-runs a failing test;
3. edits the file: with probability ``p`` (``--noisy-p``) the real fix (the task's solution), else
   a plausible wrong edit (the file with a *second* procedural change, ``taskgen.mutate``: the bug
   stays and another joins it, never the original back);
4. re-runs the failing tests and the suite's tail, and submits.

It reads only what an agent could: the instruction, the project's files as the start image holds
them, and (like ``oracle`` and ``noisy``) the task's solution to make the real fix. Steps are real
commands in the sandbox (test runs, reads), so a run measures real per-step and verify costs.
Any other Harbor task: the same exploration, then the oracle's plan or a wrong one.
"""

from __future__ import annotations

import random
import re
import shlex

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.harbor.task import HarborTask
from drumsbench.policies.registry import PolicyArgs
from drumsbench.policies.scripted import Policy
from drumsbench.taskgen import mutate

MIN_STEPS, MAX_STEPS = 20, 150
_FAILING = re.compile(r"^- `(.+)`$", re.MULTILINE)
_NAME = re.compile(rb"^\s*(?:def|class) ([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def sh(command: str) -> ActionSpec:
    return ActionSpec("shell", {"command": command})


def _pytest(ids: list[str]) -> ActionSpec:
    return sh("python3 -m pytest -p no:cacheprovider -o addopts= -q -x " + " ".join(shlex.quote(i) for i in ids)
              + " 2>&1 | tail -30")


def _wrong(rel: str, buggy: bytes, original: bytes, rng: random.Random) -> bytes:
    """The buggy file with one more procedural change that does not give the original back."""
    options = [m for m in mutate.candidates(rel, buggy) if m.apply(buggy) != original]
    if not options:
        return buggy + b"\n"
    return rng.choice(options).apply(buggy)


class Realistic(Policy):
    """The agent of the module docstring; ``p``: probability of the real fix; ``steps``: the range
    an episode's step budget is drawn from (steps: actions that run in the sandbox; the submit is
    not one, as an attempt's record does not count it)."""

    name = "realistic"

    def __init__(self, p: float = 0.5, steps: tuple[int, int] = (MIN_STEPS, MAX_STEPS)) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"--noisy-p: {p} is not a probability; give a number from 0 to 1")
        self.p, self.steps = p, steps
        self._notes: dict[str, object] = {}

    def unsupported(self, kind: str) -> str | None:
        if kind != "harbor":
            return (f"--policy realistic works Harbor tasks (--tasks harbor:DIR, e.g. made by `drumsbench tasks "
                    f"make`); the {kind} environment has its own policies (oracle, noisy, explorer)")
        return None

    def notes(self) -> dict[str, object]:
        return dict(self._notes)

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        if not isinstance(task, HarborTask):
            raise UsageError(f"--policy realistic: task {task.id} is not a Harbor task")
        solve = rng.random() < self.p
        budget = rng.randint(*self.steps)
        rel = task.spec.metadata.get("drumsbench_file")
        project = task.spec.folder / "environment" / "project"
        original = task.solution.get(f"original/{rel}") if isinstance(rel, str) else None
        if not isinstance(rel, str) or original is None or not (project / rel).is_file():
            tail = task.oracle_plan() if solve else [ActionSpec(SUBMIT)]
            look = [task.explore_action(i) for i in range(max(0, budget - _steps(tail)))]
            self._notes = {"solve": solve, "steps": len(look) + _steps(tail), "made_task": False}
            return [*look, *tail]
        buggy = (project / rel).read_bytes()
        failing = _FAILING.findall(task.description)
        tests = sorted({i.split("::")[0] for i in failing}) or ["."]
        files = sorted(str(p.relative_to(project)) for p in project.rglob("*.py"))
        names = sorted({n.decode() for n in _NAME.findall(buggy)}) or ["def"]
        lines = buggy.count(b"\n") + 1
        start = [sh("ls -la"), sh("find . -name '*.py' -not -path '*/.*' | sort | head -80"), _pytest(failing[:3]),
                 sh(f"sed -n '1,80p' {shlex.quote(tests[0])}"), sh(f"grep -n 'def \\|class ' {shlex.quote(rel)}")]
        start += [sh(f"sed -n '{a},{a + 59}p' {shlex.quote(rel)}") for a in range(1, min(lines, 600), 60)]
        fix = ActionSpec("write", {"path": rel, "content": (original if solve else _wrong(rel, buggy, original, rng))
                                   .decode(errors="replace")})
        suite = " ".join(map(shlex.quote, tests))
        end = [fix, _pytest(failing[:5]),
               sh(f"python3 -m pytest -p no:cacheprovider -o addopts= -q {suite} 2>&1 | tail -5"), ActionSpec(SUBMIT)]
        explore: list[ActionSpec] = []
        while len(start) + len(explore) + _steps(end) < budget:
            kind = rng.randrange(4)
            if kind == 0:
                f = rng.choice(files)
                a = rng.randrange(1, 400, 40)
                explore.append(sh(f"sed -n '{a},{a + 39}p' {shlex.quote(f)}"))
            elif kind == 1:
                explore.append(sh(f"grep -rn {shlex.quote(rng.choice(names))} --include='*.py' . | head -20"))
            elif kind == 2 and failing:
                explore.append(_pytest([rng.choice(failing)]))
            else:
                explore.append(sh(f"grep -n {shlex.quote(rng.choice(names))} {shlex.quote(rel)}"))
        plan = [*start, *explore, *end]  # longer than the budget only when reading the file takes more
        self._notes = {"solve": solve, "steps": _steps(plan), "made_task": True}
        return plan


def _steps(plan: list[ActionSpec]) -> int:
    """The steps of ``plan``: its actions but the submit (which runs nothing in the sandbox)."""
    return sum(1 for a in plan if a.kind != SUBMIT)


def factory(args: PolicyArgs) -> Realistic:
    """``realistic`` (a budget of 20 to 150 steps per episode) or ``realistic:N`` (N steps each: how
    ``drumsbench project`` calibrates and checks on this workload); its fix rate is ``--noisy-p``."""
    if not args.arg:
        return Realistic(args.noisy_p)
    if not args.arg.isdigit() or not 1 <= int(args.arg) <= 1000:
        raise UsageError(f"--policy: {args.spec!r}: realistic:N takes a step budget N from 1 to 1000")
    return Realistic(args.noisy_p, steps=(int(args.arg), int(args.arg)))
