"""``drumsbench tasks make``: tasks from a real project's own test suite (issue 33's CI subset: one
project, a handful of tasks; the full build is the command). The pinned sdist comes from the cache
(scripts/setup-taskgen.sh fetched it at set-up time): no test reaches the registry."""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.env import HarborEnv
from drumsbench.envs.harbor.task import load_suite
from drumsbench.experiments.harbor_check import check_harbor
from drumsbench.policies.adversary import HARBOR, PYTEST_SCORED, Adversary
from drumsbench.policies.realistic import Realistic
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.base import Substrate
from drumsbench.taskgen import make, mutate, projects

from conftest import require
from helpers import cli

PIN = "inflection==0.5.1"
KEEP = 3
CFG = RolloutConfig(step_timeout_s=120, episode_timeout_s=600)
SEQ = itertools.count()


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Substrate]:
    require(interpreter.missing())
    require(registry.get("docker").missing())
    project = projects.find(PIN)
    require(None if project.cached() else f"{PIN}: its sdist is not cached (run scripts/setup-taskgen.sh)")
    sub = registry.get("docker")("taskgen-test", tmp_path_factory.mktemp("state"))
    yield sub
    sub.close()


@pytest.fixture(scope="module")
def made(docker: Substrate, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[make.Yield]]:
    out = tmp_path_factory.mktemp("made")
    return out, make.make([projects.find(PIN)], out, docker, KEEP, None, lambda _m: None)


def test_mutations_are_exact_small_edits_that_parse() -> None:
    source = (b"def f(xs, flag=True):\n    \"\"\"Doc.\"\"\"\n    if not xs:\n        return 0\n"
              b"    return sum(x for x in xs if x < 3 and x != 1) + max(xs[0], 1)\n")
    found = mutate.candidates("m.py", source)
    assert {m.operator for m in found} == set(mutate.OPERATORS)
    for m in found:
        changed = m.apply(source)
        ast.parse(changed)
        assert changed != source and changed[:m.start] == source[:m.start]
    assert [m.key for m in found] == [m.key for m in mutate.candidates("m.py", source)]
    body = next(m for m in found if m.operator == "remove_implementation").apply(source)
    assert b'"""Doc."""' in body and b"raise NotImplementedError" in body and b"sum(" not in body


def test_a_project_gives_tasks_with_failing_and_passing_tests_and_a_yield(made: tuple[Path, list[make.Yield]]
                                                                          ) -> None:
    out, yields = made
    (y,) = yields
    assert y.pin == PIN and y.kept == KEEP and y.tried >= KEEP and y.baseline_passed > 100
    assert y.tried == y.kept + sum(y.dropped.values())
    assert json.loads((out / "yield.json").read_text())[0]["kept"] == KEEP
    tasks = load_suite(str(out))
    assert len(tasks) == KEEP
    for task in tasks:
        folder = out / task.id
        expected = json.loads((folder / "tests" / "expected.json").read_text())
        assert expected["fail_to_pass"] and expected["pass_to_pass"]
        assert not set(expected["fail_to_pass"]) & set(expected["pass_to_pass"])
        instruction = (folder / "instruction.md").read_text()
        assert expected["fail_to_pass"][0] in instruction
        rel = task.spec.metadata["drumsbench_file"]
        original = (folder / "solution" / "original" / rel).read_bytes()
        buggy = (folder / "environment" / "project" / rel).read_bytes()
        assert original != buggy  # the bug is in the start state, the fix only in the solution
        assert original.decode() not in instruction


def test_the_same_pins_make_byte_identical_folders(made: tuple[Path, list[make.Yield]], docker: Substrate,
                                                   tmp_path: Path) -> None:
    out, _ = made
    again = tmp_path / "again"
    make.make([projects.find(PIN)], again, docker, KEEP, None, lambda _m: None)
    assert _tree(again) == _tree(out)


@pytest.mark.parametrize("substrate", ["docker", "overlay", "bwrap"])
def test_every_made_task_scores_oracle_1_and_nop_0(made: tuple[Path, list[make.Yield]], tmp_path: Path,
                                                   substrate: str) -> None:
    """``tasks check`` on a container engine and on namespace substrates (overlay and bwrap run the
    image docker built from its own layer folders)."""
    out, _ = made
    results = check_harbor(f"harbor:{out}", [substrate], tmp_path / "state")
    assert len(results) == KEEP and all(c.ok for c in results), [c.problem for c in results]
    assert all(c.golden.startswith("success") and c.start.startswith("failed") for c in results)


def _namespaced(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Substrate]:
    require(registry.get(name).missing())
    sub = registry.get(name)(f"taskgen-test-{name}", tmp_path_factory.mktemp("state"))
    yield sub
    sub.close()


@pytest.fixture(scope="module")
def overlay(docker: Substrate, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Substrate]:
    yield from _namespaced("overlay", tmp_path_factory)


@pytest.fixture(scope="module")
def bwrap(docker: Substrate, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Substrate]:
    yield from _namespaced("bwrap", tmp_path_factory)


@pytest.mark.parametrize("substrate", ["docker", "overlay", "bwrap"])
def test_the_harbor_red_team_fails_on_a_made_task(made: tuple[Path, list[make.Yield]], substrate: str,
                                                  request: pytest.FixtureRequest) -> None:
    """Every Harbor strategy (a conftest, a shadowing pytest, a .pth, a plugin's entry point, replaced
    bash or python3, a background forger, links out, no tar) and every pytest-scored one (the code
    under test makes each test that calls it an xfail or a skip: pytest exits 0, which wins on
    fix-slug, tests/test_harbor_env.py) on a made task: never success, never invalid."""
    out, _ = made
    sub: Substrate = request.getfixturevalue(substrate)
    task = load_suite(str(out))[0]
    outcomes = {}
    for name in (*HARBOR, *PYTEST_SCORED):
        slot = Slot(sub, HarborEnv())
        try:
            r = run_attempt(slot, task, Adversary([name]), CFG, CanaryRegistry(), run_id=sub.run_id,
                            seq=next(SEQ), seed=0)
        finally:
            slot.destroy()
        outcomes[name] = (r.outcome, r.cause, r.detail)
    assert all(o is Outcome.FAILED for o, _, _ in outcomes.values()), outcomes


# The made task's verdict is pytest's report, made in a process that imports the agent's code: a few
# lines of it, run at exit, find pytest's session and print a PASSED line for every collected test.
REPORT_FORGE = """
import atexit as _dz_atexit, gc as _dz_gc, os as _dz_os
def _dz_forge():
    for o in _dz_gc.get_objects():
        if type(o).__name__ == "Session" and hasattr(o, "items"):
            _dz_os.write(1, "".join("PASSED %s\\n" % i.nodeid for i in o.items).encode())
            break
_dz_atexit.register(_dz_forge)
"""


def test_the_agents_code_can_forge_a_made_tasks_report_and_the_record_says_in_process(
        made: tuple[Path, list[make.Yield]], docker: Substrate) -> None:
    """The stated limit of every made task (and every Harbor task): the verifier's pytest runs the
    agent's code, which can forge the report the score is read from. It reaches success on the buggy
    code, and the attempt's record says the verdict was decided in-process (docs/taskgen.md)."""
    out, _ = made
    task = load_suite(str(out))[0]
    rel = str(task.spec.metadata["drumsbench_file"])
    buggy = (task.spec.folder / "environment" / "project" / rel).read_text()

    class Forge(Adversary):
        def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
            return [ActionSpec("write", {"path": rel, "content": buggy + REPORT_FORGE}), ActionSpec(SUBMIT)]

    slot = Slot(docker, HarborEnv())
    try:
        r = run_attempt(slot, task, Forge(["harbor_links_out"]), CFG, CanaryRegistry(), run_id=docker.run_id,
                        seq=next(SEQ), seed=0)
    finally:
        slot.destroy()
    assert r.outcome is Outcome.SUCCESS, (r.outcome, r.cause, r.detail)
    assert r.extra.get("trust") == "in-process"


def test_project_calibrates_and_checks_with_the_realistic_agent(made: tuple[Path, list[make.Yield]],
                                                               overlay: Substrate, tmp_path: Path) -> None:
    """``drumsbench project --policy realistic`` on made tasks (overlay): calibration trajectories of
    the realistic agent's real work (reads, greps, test runs), a projection of 1M x 40 steps, and a
    real 40-step trajectory measured beside it."""
    out, _ = made
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    cli("project", "--tasks", f"harbor:{out}", "--policy", "realistic", "--substrate", "overlay",
        "--calibrate-attempts", "2", "--calibrate-steps", "20", "--check", "1", "--steps", "40",
        "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "p.json"), "--no-progress", env=env, check=True)
    p = json.loads((tmp_path / "p.json").read_text())
    one, = p["projections"]
    c = one["check"]
    assert c["n"] == 1 and c["mean_steps"] == 40, one
    assert abs(c["error"]) <= 0.5, f"projected {c['projected_s']} vs measured {c['measured_s']}"
    bad = cli("project", "--tasks", f"harbor:{out}", "--policy", "nosuch", "--substrate", "overlay",
              "--out", str(tmp_path / "runs"), env=env)
    assert bad.returncode == 2 and "--policy" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_the_realistic_agent_explores_edits_and_scores_as_its_fix(made: tuple[Path, list[make.Yield]],
                                                                  docker: Substrate, p: float) -> None:
    """``--policy realistic``: reads, runs the failing tests, edits the file, re-runs, submits; the
    real fix (p=1) succeeds, the plausible wrong edit (p=0: a second change, the bug kept) fails."""
    out, _ = made
    task = load_suite(str(out))[0]
    policy = Realistic(p, steps=(20, 24))
    slot = Slot(docker, HarborEnv())
    try:
        r = run_attempt(slot, task, policy, CFG, CanaryRegistry(), run_id=docker.run_id, seq=next(SEQ), seed=3)
    finally:
        slot.destroy()
    assert r.outcome is (Outcome.SUCCESS if p else Outcome.FAILED), (r.outcome, r.cause, r.detail)
    assert r.extra.get("solve") is bool(p) and r.extra.get("made_task") is True
    assert 20 <= len(r.steps_s) <= 40  # the budget, or more when reading the changed file takes more


@pytest.mark.parametrize(("args", "want"), [
    (["--from", "nosuch==1"], "--from: nosuch==1 is not pinned in the project manifest"),
    (["--from", PIN, "--max-tasks", "0"], "--max-tasks: 0 keeps nothing"),
    (["--from", PIN, "--substrate", "process"], "--substrate: process cannot build task images"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], want: str) -> None:
    res = cli("tasks", "make", *args, "--to", str(tmp_path / "o"), "--no-progress")
    assert res.returncode == 2 and res.stderr.startswith(f"error: {want}"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
