"""``drumsbench tasks check``: prove, on a substrate's own image, that a coding suite's verifier works.

For every task, in a real sandbox of the substrate, through the same environment and verifier as
a run: the start state digests to the task's fingerprint, the hidden tests load and **fail** on the
start state (a valid "not done", never a missing module or an unavailable verifier), and **pass**
after the golden patch. A hidden test that imports a module the image lacks is refused here,
before any training; at run time the same task is invalid (``verifier_unavailable``), never 0.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from drumsbench.core.errors import InvalidAttempt, MissingDependency, PolicyFault, SubstrateError
from drumsbench.envs.base import Action
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import CodingTask, load_suite
from drumsbench.substrates import registry


@dataclass(frozen=True)
class TaskCheck:
    substrate: str
    task: str
    ok: bool
    start: str  # what the verifier said on the start state
    golden: str  # ... and after the golden patch
    problem: str = ""


def _verify(env: CodingEnv, task: CodingTask) -> str:
    """``passed``, ``failed: reason``, ``missing dependency: M`` or ``unavailable: detail``."""
    try:
        env.stage_verifier(task)
        return "passed" if env.run_verifier(task, task.verify_timeout) else "failed"
    except PolicyFault as e:
        return f"failed: {e.reason}"
    except MissingDependency as e:
        return f"missing dependency: {e.module}"
    except InvalidAttempt as e:
        return f"unavailable: {e.detail}"


def check_task(env: CodingEnv, task: CodingTask) -> tuple[str, str, str]:
    """(start verdict, golden verdict, problem or '') in the env's attached, emptied sandbox."""
    box = env.box
    env.reset(task)
    got = env.fingerprint()
    if got != task.start_fingerprint:
        return "", "", f"start state digests to {got[:23]}..., task.toml says {task.start_fingerprint[:23]}..."
    start = _verify(env, task)
    box.reset_in_place()
    env.reset(task)
    obs = env.step(Action("patch", env.generation, {"patch": task.golden_patch}), 60.0)
    if obs.content.get("exit_code") != 0:
        return start, "", f"golden patch does not apply in the sandbox: {obs.content.get('stderr', '')[:200]}"
    golden = _verify(env, task)
    for label, verdict in (("start", start), ("golden", golden)):
        if verdict.startswith("missing dependency"):
            return start, golden, f"hidden tests need a module the image lacks ({verdict}); add it to the image"
        if verdict.startswith("unavailable"):
            return start, golden, f"verifier unavailable on the {label} state: {verdict}"
    if start == "passed":
        return start, golden, "hidden tests pass on the start state: they do not detect the bug"
    if golden != "passed":
        return start, golden, f"hidden tests do not pass after the golden patch: {golden}"
    return start, golden, ""


def check_suite(suite: str, substrates: list[str], state_dir: Path,
                progress: Callable[[TaskCheck], None] = lambda _c: None) -> list[TaskCheck]:
    """Check every task of ``suite`` on each substrate; one ``TaskCheck`` per (substrate, task)."""
    tasks = load_suite(suite)
    out: list[TaskCheck] = []
    for name in substrates:
        sub = registry.get(name)(f"check-{uuid.uuid4().hex[:8]}", state_dir)
        env = CodingEnv()
        try:
            box = sub.create()
            env.attach(box)
            for task in tasks:
                box.reset_in_place()
                try:
                    start, golden, problem = check_task(env, task)
                except SubstrateError as e:
                    start, golden, problem = "", "", f"substrate failed: {e}"
                result = TaskCheck(name, task.id, not problem, start, golden, problem)
                progress(result)
                out.append(result)
            box.destroy()
        finally:
            sub.close()
    return out


def check_coding(suite: str, substrates: list[str], state_dir: Path,
                 progress: Callable[[TaskCheck], None] = lambda _c: None) -> list[TaskCheck]:
    """The coding kind's task checks (``EnvKind.task_checks``): the suite's data on the host (every
    patch applies, wrong patches fail, visible tests never reveal a bug, ``coding_data.py``), then
    every task on each substrate's image (``check_suite``)."""
    from drumsbench.envs.coding.task import suite_dir
    from drumsbench.experiments.coding_data import check_data

    reports, strays, _ = check_data(suite_dir(suite))
    out: list[TaskCheck] = []
    for r in reports:
        c = TaskCheck("host", r.name, not r.problems, "", "", "; ".join(r.problems))
        out.append(c)
        progress(c)
    if strays:
        c = TaskCheck("host", "suite", False, "", "", f"folders without task.toml: {', '.join(strays)}")
        out.append(c)
        progress(c)
    return out + check_suite(suite, substrates, state_dir, progress)
