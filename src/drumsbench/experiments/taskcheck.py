"""``drumsbench tasks check``: prove, on a substrate's own image, that a coding suite's verifier works.

For every task, in a real sandbox of the substrate, through the same environment and verifier as
a run: the start state digests to the task's fingerprint, the hidden tests load and **fail** on the
start state (a valid "not done", never a missing module or an unavailable verifier), and **pass**
after the golden patch. A hidden test that imports a module the image lacks is refused here,
before any training; at run time the same task is invalid (``verifier_unavailable``), never 0.

Each state is verified ``repeat`` times (default ``DEFAULT_REPEAT``), each time from a fresh reset,
exactly as a run's attempt meets it. A task whose verdict differs between runs of the same state is
refused as flaky, naming the test(s) the verifier's reasons name in some runs and not in others (a
correct fix that fails a third of the time scores a third of correct solutions 0).
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
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
    # who decides the task's verdicts on this substrate: "judge" (trusted) or "in-process (why)"
    trust: str = ""


def _verify(env: CodingEnv, task: CodingTask) -> str:
    """``passed``, ``failed: reason``, ``missing dependency: M`` or ``unavailable: detail``."""
    try:
        env.stage_verifier(task)
        result = env.run_verifier(task, task.verify_timeout)
        return "passed" if result.passed else f"failed: {result.reason}"
    except PolicyFault as e:
        return f"failed: {e.reason}"
    except MissingDependency as e:
        return f"missing dependency: {e.module}"
    except InvalidAttempt as e:
        return f"unavailable: {e.detail}"


DEFAULT_REPEAT = 5
# the runner's reason names the first test that did not pass: "...; <test id>: fail"
_NAMED_TEST = re.compile(r"; ([A-Za-z_][\w.]*): [a-z,]+")


def flaky_problem(label: str, verdicts: list[str]) -> str:
    """'' when every verdict of the ``label`` state is the same; otherwise one line naming the flaky
    test(s): those the reasons name in some runs and not in others (else every test they name), and
    how often each verdict came."""
    counts = Counter(verdicts)
    if len(counts) < 2:
        return ""
    named = [set(_NAMED_TEST.findall(v)) for v in verdicts]
    changing = set.union(*named) - set.intersection(*named)
    if changing:
        tests = ", ".join(sorted(changing))
    else:  # the reasons name only the first test that did not pass, the same one in every run
        first = ", ".join(sorted(set.union(*named))) or "none"
        tests = f"not named: the verifier names only the first test that did not pass ({first}) in every run"
    seen = "; ".join(f"{n}x {' '.join(v.split())[:160]!r}" for v, n in counts.most_common())
    return (f"flaky: the verdict on the {label} state changed between {len(verdicts)} runs (flaky test: {tests}); "
            f"verdicts: {seen}; make the test deterministic")


def _start_state(env: CodingEnv, task: CodingTask) -> str:
    """Reset to the task's start state; '' or why it is not that state."""
    env.box.reset_in_place()
    env.reset(task)
    got = env.fingerprint()
    if got != task.start_fingerprint:
        return f"start state digests to {got[:23]}..., task.toml says {task.start_fingerprint[:23]}..."
    return ""


def _golden_state(env: CodingEnv, task: CodingTask) -> str:
    """Reset, then apply the golden patch; '' or why it did not apply."""
    env.box.reset_in_place()
    env.reset(task)
    obs = env.step(Action("patch", env.generation, {"patch": task.golden_patch}), 60.0)
    if obs.content.get("exit_code") != 0:
        return f"golden patch does not apply in the sandbox: {obs.content.get('stderr', '')[:200]}"
    return ""


def check_task(env: CodingEnv, task: CodingTask, repeat: int = DEFAULT_REPEAT) -> tuple[str, str, str]:
    """(start verdict, golden verdict, problem or '') in the env's attached sandbox: each state is
    verified ``repeat`` times, each from a fresh reset; the verdicts returned are the first run's."""
    runs: dict[str, list[str]] = {"start": [], "golden": []}
    for label, make in (("start", _start_state), ("golden", _golden_state)):
        for _ in range(max(1, repeat)):
            problem = make(env, task)
            if problem:
                return (runs["start"] or [""])[0], "", problem
            verdict = _verify(env, task)
            runs[label].append(verdict)
            start, golden = runs["start"][0], (runs["golden"] or [""])[0]
            if verdict.startswith("missing dependency"):
                return start, golden, f"hidden tests need a module the image lacks ({verdict}); add it to the image"
            if verdict.startswith("unavailable"):
                return start, golden, f"verifier unavailable on the {label} state: {verdict}"
    # the golden state first: all its tests should pass, so its reasons name the flaky test itself
    for label in ("golden", "start"):
        flaky = flaky_problem(label, runs[label])
        if flaky:
            return start, golden, flaky
    if start == "passed":
        return start, golden, "hidden tests pass on the start state: they do not detect the bug"
    if golden != "passed":
        return start, golden, f"hidden tests do not pass after the golden patch: {golden}"
    return start, golden, ""


def check_suite(suite: str, substrates: list[str], state_dir: Path,
                progress: Callable[[TaskCheck], None] = lambda _c: None,
                repeat: int = DEFAULT_REPEAT) -> list[TaskCheck]:
    """Check every task of ``suite`` on each substrate, each state ``repeat`` times (``check_task``);
    one ``TaskCheck`` per (substrate, task)."""
    tasks = load_suite(suite)
    out: list[TaskCheck] = []
    for name in substrates:
        sub = registry.get(name)(f"check-{uuid.uuid4().hex[:8]}", state_dir)
        env = CodingEnv()
        try:
            box = sub.create()
            env.attach(box)
            for task in tasks:
                try:
                    start, golden, problem = check_task(env, task, repeat)
                except SubstrateError as e:
                    start, golden, problem = "", "", f"substrate failed: {e}"
                why_not = env.judged(task)
                trust = "judge" if why_not is None else f"in-process ({why_not})"
                result = TaskCheck(name, task.id, not problem, start, golden, problem, trust)
                progress(result)
                out.append(result)
            box.destroy()
        finally:
            sub.close()
    return out


def check_coding(suite: str, substrates: list[str], state_dir: Path,
                 progress: Callable[[TaskCheck], None] = lambda _c: None,
                 repeat: int = DEFAULT_REPEAT) -> list[TaskCheck]:
    """The coding kind's task checks (``EnvKind.task_checks``): the suite's data on the host (every
    patch applies, wrong patches fail, visible tests never reveal a bug, ``coding_data.py``), then
    every task on each substrate's image, each state verified ``repeat`` times (``check_suite``)."""
    from drumsbench.envs.suite_folders import suite_dir
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
    return out + check_suite(suite, substrates, state_dir, progress, repeat)
