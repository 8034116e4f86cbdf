"""The ``harbor`` environment kind: Harbor task folders run as attempts, each in a fresh sandbox of the
task's own image, verified in a fresh sandbox of the verifier's pristine image (docs/harbor.md).

Real parts throughout: Harbor's own models read the folders, docker and podman build the images and
run the sandboxes, every attempt goes through ``run_attempt`` with all gates. The red team's
strategies (``policies/adversary.py``: ``HARBOR``) each end failed here and, as their positive
control, each forging one reaches success against Harbor 0.26's own shared mode
(``HarborEnv(verifier="harbor-shared")``: test.sh in the agent's own container, the reward file read).
"""

from __future__ import annotations

import io
import itertools
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.carry import CarryRefused, clean_archive
from drumsbench.envs.harbor.env import HarborEnv, parse_reward
from drumsbench.envs.harbor.task import HarborTask, load_suite
from drumsbench.experiments.envcheck import check_environment
from drumsbench.experiments.harbor_check import check_harbor
from drumsbench.policies.adversary import (
    HARBOR,
    HARBOR_CONTROLS,
    HARBOR_NOT_FORGING,
    HARBOR_WORKTREE_CONTROLS,
    PYTEST_SCORED,
    PYTEST_SCORED_CONTROL,
    Adversary,
)
from drumsbench.policies.scripted import Policy, make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages, RootCommands, Substrate
from drumsbench.testing.naive_gates import NaiveDockerSubstrate, WorkTreeTestsHarborEnv

from conftest import require
from helpers import cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"
EXAMPLE_IDS = ["build-checksum", "count-words", "fix-median", "fix-roman", "fix-slug", "install-service", "log-summary",
               "merge-json", "revert-commit", "set-timezone-config"]
CFG = RolloutConfig(step_timeout_s=120, episode_timeout_s=600)
SEQ = itertools.count()


# -- the carry, on the host -------------------------------------------------------------------
def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (name, kind, data): kind ``f`` a file (data its bytes), ``d`` a folder, ``l`` a link
    (data its target), ``h`` a hard link (data the name it links to)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "f":
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o4755
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE}[kind]
                info.linkname = str(data)
                tar.addfile(info)
    return buf.getvalue()


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar}


def test_carry_keeps_the_carried_paths_and_cuts_special_bits() -> None:
    data = _tar(("app", "d", ""), ("app/run", "f", b"#!/bin/sh\n"), ("app/copy", "h", "app/run"),
                ("app/link", "l", "/etc/passwd"))
    got = _members(clean_archive(data, ("/app",)))
    assert sorted(got) == ["app", "app/copy", "app/link", "app/run"]
    assert got["app/run"].mode == 0o755  # set-uid cut
    assert got["app/copy"].isfile() and got["app/copy"].size == len(b"#!/bin/sh\n")
    assert got["app/link"].issym() and got["app/link"].linkname == "/etc/passwd"


@pytest.mark.parametrize(("members", "why"), [
    ((("etc/passwd", "f", b"x"),), "outside /app"),
    ((("app/../etc/passwd", "f", b"x"),), "outside /app"),
    ((("app/x", "l", "/logs/verifier"), ("app/x/reward.txt", "f", b"1")), "through a link"),
    ((("app/x", "h", "etc/shadow"),), "no file before it"),
])
def test_carry_refuses_what_reaches_outside(members: tuple[tuple[str, str, bytes | str], ...], why: str) -> None:
    with pytest.raises(CarryRefused, match=why):
        clean_archive(_tar(*members), ("/app",))
    with pytest.raises(CarryRefused, match="not a readable archive"):
        clean_archive(b"not a tar" * 100, ("/app",))


def test_reward_files_are_read_as_harbor_writes_them() -> None:
    assert parse_reward(b"1\n", None) == 1.0
    assert parse_reward(None, json.dumps({"reward": 0.25}).encode()) == 0.25
    assert parse_reward(None, json.dumps({"accuracy": 1}).encode()) == 1.0  # one number
    assert parse_reward(b"1\n", b'{"reward": 0}') == 0.0  # reward.json first, as Harbor 0.26 reads them
    assert "not a number" in str(parse_reward(None, b'{"reward": 1, "note": "ok"}'))
    assert "no 'reward'" in str(parse_reward(None, json.dumps({"a": 1, "b": 0}).encode()))
    assert "not a number" in str(parse_reward(b"yes", None))
    assert "wrote no reward" in str(parse_reward(None, None))
    assert "nan" in str(parse_reward(b"nan", None))


# -- reading: the working folder and the carried paths ----------------------------------------------
@pytest.fixture(scope="module")
def harbor_here() -> None:
    require(interpreter.missing())


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / "suite" / name
    shutil.copytree(EXAMPLES / name, dest, symlinks=True)
    return dest


@pytest.mark.usefixtures("harbor_here")
@pytest.mark.parametrize(("edit", "want"), [
    (("environment/Dockerfile", "WORKDIR /app", "WORKDIR /usr/local"), "is or holds a system or verifier folder"),
    (("environment/Dockerfile", "WORKDIR /app", "WORKDIR /"), "is or holds a system or verifier folder"),
    (("environment/Dockerfile", "WORKDIR /app\n", ""), "no WORKDIR"),
    (("task.toml", "[metadata]", '[metadata]\ndrumsbench_carry = ["/logs"]'), "drumsbench_carry"),
    (("task.toml", "[metadata]", '[metadata]\ndrumsbench_carry = "/etc"'), "give a list of absolute paths"),
    (("task.toml", "[agent]\n", '[agent]\nuser = "nobody"\n'), "[agent] user = 'nobody'"),
    (("task.toml", "[verifier]\n", "[verifier]\nuser = 0\n"), "[verifier] user = 0"),
])
def test_working_folder_and_carry_are_checked(tmp_path: Path, edit: tuple[str, str, str], want: str) -> None:
    folder = _copy(tmp_path, "count-words")
    rel, old, new = edit
    text = (folder / rel).read_text()
    assert old in text
    (folder / rel).write_text(text.replace(old, new, 1))
    with pytest.raises(UsageError) as e:
        load_suite(str(folder))
    assert want in str(e.value) and "\n" not in str(e.value), e.value


@pytest.mark.usefixtures("harbor_here")
def test_tasks_fingerprint_takes_one_task_folder_or_a_folder_of_them() -> None:
    """``drumsbench tasks fingerprint harbor:TASK`` (one folder, as ``--tasks harbor:TASK`` takes it)
    prints the same line as for the whole folder of examples."""
    whole = cli("tasks", "fingerprint", f"harbor:{EXAMPLES}", check=True).stdout.splitlines()
    one = cli("tasks", "fingerprint", f"harbor:{EXAMPLES / 'fix-slug'}", check=True).stdout.splitlines()
    assert len(whole) == len(EXAMPLE_IDS) and one == [line for line in whole if line.startswith("fix-slug ")]
    bad = cli("tasks", "fingerprint", str(EXAMPLES / "fix-slug"))  # no kind named: a suite folder
    assert bad.returncode == 2 and "holds no */task.toml" in bad.stderr


def test_the_kind_is_named_before_the_folder() -> None:
    suite = suites.load(f"harbor:{EXAMPLES}")
    assert suite.kind == "harbor" and [t.id for t in suite.tasks] == EXAMPLE_IDS
    words = next(t for t in suite.tasks if t.id == "count-words")
    assert isinstance(words, HarborTask) and words.carry == ("/app",)
    timezone = next(t for t in suite.tasks if t.id == "set-timezone-config")
    assert isinstance(timezone, HarborTask) and timezone.carry == ("/work", "/etc/app")
    with pytest.raises(UsageError, match="not a folder"):
        suites.suite_folder("harbor:/nonexistent/tasks")


# -- running -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["docker", "podman", "overlay", "bwrap"])
def sub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, harbor_here: None
        ) -> Iterator[Substrate]:
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls(f"harbor-env-{request.param}", tmp_path_factory.mktemp("state"))
    yield s
    s.close()


def _task(name: str) -> HarborTask:
    return next(t for t in load_suite(str(EXAMPLES)) if t.id == name)


class Plan(Policy):
    """A fixed list of actions (then submit)."""

    name = "plan"

    def __init__(self, actions: list[ActionSpec]) -> None:
        super().__init__()
        self.actions = actions

    def plan(self, task: Task, rng: object) -> list[ActionSpec]:  # type: ignore[override]
        return [*self.actions, ActionSpec(SUBMIT)]


def attempt(sub: Substrate, task: HarborTask, policy: Policy, env: HarborEnv | None = None,
            fault: InvalidCause | None = None) -> AttemptRecord:
    slot = Slot(sub, env or HarborEnv())
    try:
        return run_attempt(slot, task, policy, CFG, CanaryRegistry(), run_id=sub.run_id, seq=next(SEQ), seed=0,
                           fault=fault)
    finally:
        slot.destroy()


def test_oracle_scores_1_and_nop_0_on_every_example(sub: Substrate, tmp_path: Path) -> None:
    """Harbor's own oracle/nop check, through a run's path (``tasks check harbor:DIR``)."""
    results = check_harbor(f"harbor:{EXAMPLES}", [sub.name], tmp_path / "state")
    assert [(c.task, c.ok) for c in results] == [(t, True) for t in EXAMPLE_IDS], [c.problem for c in results]
    assert {c.trust for c in results} == {"in-process"}
    assert all(c.golden.startswith("success") and c.start.startswith("failed") for c in results)


def test_a_separate_verifier_image_does_not_make_the_start_images_own_files_new(sub: Substrate,
                                                                               tmp_path: Path) -> None:
    """A start image whose working folder holds a ``pyproject.toml`` and a ``conftest.py`` (a Python
    project, as most are), verified in a separate image whose working folder is empty: the steering
    files are compared with the start image's own, so the oracle still scores 1 — and a changed one
    still fails."""
    folder = _copy(tmp_path, "fix-median")
    env_dir = folder / "environment"
    (env_dir / "pyproject.toml").write_text('[project]\nname = "stats"\nversion = "0"\n')
    (env_dir / "conftest.py").write_text("")
    text = (env_dir / "Dockerfile").read_text()
    (env_dir / "Dockerfile").write_text(text.replace("COPY stats.py /app/stats.py",
                                                     "COPY stats.py pyproject.toml conftest.py /app/"))
    (task,) = load_suite(str(folder))
    assert task.separate
    assert attempt(sub, task, make_policy("oracle")).outcome is Outcome.SUCCESS
    changed = attempt(sub, task, Plan([*task.oracle_plan()[:-1], ActionSpec("write", {
        "path": "conftest.py", "content": "import os\n"})]))
    assert changed.outcome is Outcome.FAILED and "/app/conftest.py" in changed.detail, changed.detail


def test_environment_checker_passes_with_faults_classified(sub: Substrate) -> None:
    checks = check_environment(HarborEnv, _task("count-words"), sub)
    assert [(c.check, c.ok) for c in checks] == [(c.check, True) for c in checks], checks
    assert {c.check for c in checks} >= {"reset", "oracle", "null", "bad_observation", "verifier_unavailable"}


def test_a_dirty_start_is_invalid_and_each_attempt_gets_a_fresh_sandbox(sub: Substrate) -> None:
    task = _task("count-words")
    dirty = attempt(sub, task, make_policy("oracle"), fault=InvalidCause.DIRTY_RESET)
    assert (dirty.outcome, dirty.cause) == (Outcome.INVALID, InvalidCause.DIRTY_RESET), dirty.detail
    env = HarborEnv()
    slot = Slot(sub, env)
    try:
        first = run_attempt(slot, task, make_policy("oracle"), CFG, CanaryRegistry(), run_id=sub.run_id,
                            seq=next(SEQ), seed=0)
        box = slot.sandbox
        second = run_attempt(slot, task, make_policy("null"), CFG, CanaryRegistry(), run_id=sub.run_id,
                             seq=next(SEQ), seed=0)
        assert (first.outcome, second.outcome) == (Outcome.SUCCESS, Outcome.FAILED), (first.detail, second.detail)
        assert slot.sandbox is not box  # the oracle's count.txt did not reach the nop's attempt
    finally:
        slot.destroy()


def test_the_tasks_own_resources_bound_its_sandboxes(sub: Substrate, tmp_path: Path) -> None:
    """``[environment] memory_mb / storage_mb / cpus`` bound the task's sandboxes (the agent's and the
    verifier's), each tightening the run's bound, never loosening it: 300 MiB cannot be held under
    96 MiB (it can under the run's 4 GiB), 100 MiB cannot be written under the disk bound (where this
    substrate enforces one), and a busy second of wall time gets half a CPU's time under cpus 0.5."""
    folder = _copy(tmp_path, "count-words")
    toml = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(toml.replace("cpus = 1\nmemory_mb = 512\nstorage_mb = 1024",
                                                   "cpus = 0.5\nmemory_mb = 96\nstorage_mb = 64"))
    (task,) = load_suite(str(folder))
    limits = HarborEnv().task_limits(task, sub.limits)
    assert (limits.memory_mb, limits.disk_mb, limits.cpus, limits.pids) == (96, 64, 0.5, sub.limits.pids)
    assert HarborEnv().task_limits(task, sub.limits.within(memory_mb=64)).memory_mb == 64  # never loosened
    assert isinstance(sub, RecipeImages)
    image = sub.build_recipe(task.start_recipe)
    hold = ["python3", "-c", "b = bytearray(300 << 20); print(len(b))"]
    burn = ["python3", "-c", "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.0: pass\n"
                             "print(time.process_time())"]
    free = sub.create_from_image(image)
    try:
        assert free.exec(hold, timeout=60, cwd="/app").exit_code == 0  # the control: the run's bound holds it
    finally:
        free.destroy()
    box = sub.create_from_image(image, limits)
    try:
        held = box.exec(hold, timeout=60, cwd="/app")
        assert held.exit_code != 0 and b"314572800" not in held.stdout, held
        if "not enforced" not in sub.limit_mechanisms()["disk_mb"]:
            wrote = box.exec(["sh", "-c", "head -c 100M /dev/zero > /app/big"], timeout=60, cwd="/app")
            assert wrote.exit_code != 0 and b"No space" in wrote.stderr, wrote
        cpu = float(box.exec(burn, timeout=60, cwd="/app").stdout)
        assert cpu < 0.7, cpu
    finally:
        box.destroy()
    assert attempt(sub, task, make_policy("oracle")).outcome is Outcome.SUCCESS  # the verifier fits its bounds


def test_a_task_image_whose_user_is_not_root(sub: Substrate, tmp_path: Path) -> None:
    """A Dockerfile ending ``USER agent``: on docker and podman the agent's commands run as that user
    (its ``HOME`` writable, the system not), the harness's set-up as the sandbox's root with root's
    capabilities (the container is root's, each command of the sandbox's own is the user's), test.sh
    as the user, as Harbor runs it; oracle 1, nop 0. overlay and bwrap run every command as root and
    refuse such an image in one line."""
    folder = _copy(tmp_path, "count-words")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY notes.txt /app/notes.txt\n"
        "RUN useradd -m agent && chown -R agent /app\nUSER agent\n")
    (task,) = load_suite(str(folder))
    assert isinstance(sub, RecipeImages)
    if sub.name in ("overlay", "bwrap"):
        with pytest.raises(SubstrateError, match=f"^{sub.name}: image .* runs as USER agent"):
            sub.build_recipe(task.start_recipe)
        return
    box = sub.create_from_image(sub.build_recipe(task.start_recipe))
    try:
        mine = box.exec(["sh", "-c", "id -un; touch $HOME/x && echo home; touch /etc/x 2>/dev/null || echo no-etc"],
                        timeout=30, cwd="/app")
        assert mine.stdout.split() == [b"agent", b"home", b"no-etc"], mine
        assert isinstance(box, RootCommands)
        root = box.exec_as_root(["sh", "-c", "id -u; grep CapEff /proc/self/status"], timeout=30, cwd="/")
        assert root.stdout.split()[0] == b"0" and not root.stdout.strip().endswith(b"0000000000000000"), root
    finally:
        box.destroy()
    assert attempt(sub, task, make_policy("oracle")).outcome is Outcome.SUCCESS
    assert attempt(sub, task, make_policy("null")).outcome is Outcome.FAILED


# -- the red team --------------------------------------------------------------------------------
def sh(command: str) -> ActionSpec:
    return ActionSpec("shell", {"command": command})


def test_every_harbor_strategy_has_a_control_or_says_why_not() -> None:
    groups = (set(HARBOR_CONTROLS), set(HARBOR_WORKTREE_CONTROLS), set(HARBOR_NOT_FORGING))
    assert set(HARBOR) == set.union(*groups) and sum(map(len, groups)) == len(HARBOR)  # each in one group
    assert set(HARBOR_CONTROLS.values()) | set(HARBOR_WORKTREE_CONTROLS.values()) <= set(EXAMPLE_IDS)


@pytest.mark.parametrize("strategy", sorted(HARBOR))
def test_strategy_fails_here_and_wins_against_harbors_shared_mode(sub: Substrate, strategy: str) -> None:
    """``drumsbench run --policy adversary:<strategy>`` on its control task: failed under the
    fresh-sandbox verifier; reaching success under Harbor 0.26's shared mode (the positive control:
    one engine shows it) for every strategy that forges."""
    task = _task(HARBOR_CONTROLS.get(strategy) or HARBOR_WORKTREE_CONTROLS.get(strategy) or "count-words")
    here = attempt(sub, task, Adversary([strategy]))
    assert here.outcome is Outcome.FAILED, (strategy, here.outcome, here.cause, here.detail)
    assert here.extra.get("strategy") == strategy and here.extra.get("trust") == "in-process"
    if sub.name == "docker" and strategy in HARBOR_CONTROLS:
        naive = attempt(sub, task, Adversary([strategy]), env=HarborEnv(verifier="harbor-shared"))
        assert naive.outcome is Outcome.SUCCESS, (strategy, "positive control", naive.outcome, naive.detail)
        assert naive.extra.get("trust") == "agent-container"
    if sub.name == "docker" and strategy in HARBOR_WORKTREE_CONTROLS:
        # Harbor runs the task's own /tests/test.sh: the lookalike wins only where a runner takes the work tree's
        shared = attempt(sub, task, Adversary([strategy]), env=HarborEnv(verifier="harbor-shared"))
        naive = attempt(sub, task, Adversary([strategy]), env=WorkTreeTestsHarborEnv())
        assert (shared.outcome, naive.outcome) == (Outcome.FAILED, Outcome.SUCCESS), (shared.detail, naive.detail)


def test_a_broken_python3_is_invalid_only_under_gates_run_by_the_containers_own(harbor_here: None,
                                                                                tmp_path: Path) -> None:
    """``harbor_break_python3``'s positive control: where the gates run the container's python3
    (``testing.naive_gates``, docker) the attempt is invalid; on docker and podman it ends failed
    (``test_strategy_fails_here_and_wins_against_harbors_shared_mode``)."""
    require(registry.get("docker").missing())
    naive = NaiveDockerSubstrate("harbor-env-naive", tmp_path)
    try:
        got = attempt(naive, _task("count-words"), Adversary(["harbor_break_python3"]))
    finally:
        left = naive.leftovers()
        naive.close()
    assert (got.outcome, got.cause) == (Outcome.INVALID, InvalidCause.SUBSTRATE_FAILURE), (got.outcome, got.detail)
    assert not left, left


def test_a_task_specific_tool_shim_fails_here_and_wins_against_harbors_shared_mode(sub: Substrate) -> None:
    """count-words' test.sh counts with ``wc``: a ``wc`` that prints 0 and a count.txt of 0."""
    shim = Plan([sh("printf '#!/bin/sh\\necho 0\\n' > /usr/bin/wc && chmod 755 /usr/bin/wc && "
                    "echo 0 > /app/count.txt")])
    task = _task("count-words")
    assert attempt(sub, task, shim).outcome is Outcome.FAILED
    if sub.name == "docker":
        assert attempt(sub, task, shim, env=HarborEnv(verifier="harbor-shared")).outcome is Outcome.SUCCESS


def test_the_agents_own_code_can_forge_and_the_record_says_in_process(sub: Substrate) -> None:
    """What the fresh sandbox cannot remove: code the tests import runs in the verifier's process tree
    (a wrong median whose module makes pytest exit 0). It reaches success — the known limit of every
    Harbor task — and the attempt's record says the verdict was in-process."""
    forged = attempt(sub, _task("fix-slug"), Plan([ActionSpec("write", {"path": "slug.py", "content": (
        "import atexit, os\natexit.register(os._exit, 0)\n\n\ndef slug(title):\n    return ''\n")})]))
    assert forged.outcome is Outcome.SUCCESS, forged.detail
    assert forged.extra.get("trust") == "in-process"


@pytest.mark.parametrize("strategy", sorted(PYTEST_SCORED))
def test_code_under_test_that_xfails_or_skips_wins_where_the_exit_status_scores(sub: Substrate, strategy: str
                                                                              ) -> None:
    """The positive control of ``PYTEST_SCORED``: every function of the code under test made an xfail
    (or a skip) makes fix-slug's ``pytest`` exit 0, so its test.sh writes 1 — through this kind's
    fresh-sandbox verifier too: the agent's code runs in the verifier's process, and the record says
    so. On the made tasks, where each expected id must be PASSED, the same strategies end failed
    (tests/test_tasks_make.py)."""
    got = attempt(sub, _task(PYTEST_SCORED_CONTROL), Adversary([strategy]))
    assert got.outcome is Outcome.SUCCESS, (strategy, got.outcome, got.detail)
    assert got.extra.get("trust") == "in-process" and got.extra.get("strategy") == strategy


def test_coldstart_of_a_task_image_beside_its_floor(harbor_here: None, tmp_path: Path) -> None:
    """``drumsbench coldstart --tasks harbor:...``: sandboxes of the task's own image on docker and
    overlay (overlay mounts the layers docker built), each beside the floor of that same image; a
    substrate that cannot run task images is one line, exit 2."""
    for name in ("docker", "overlay"):
        require(registry.get(name).missing())
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    cli("coldstart", "--tasks", f"harbor:{EXAMPLES}", "--task", "fix-slug", "--substrate", "docker,overlay",
        "-n", "3", "--idle", "1", "--reset-n", "2", "--out", str(tmp_path / "runs"), "--json",
        str(tmp_path / "c.json"), "--no-progress", env=env, check=True)
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["config"]["task"] == "fix-slug"
    docker_r, overlay_r = data["results"]
    for r in (docker_r, overlay_r):
        assert r["success"]["value"] == 1.0 and r["first_command"]["n"] == 3, r["errors"]
        assert r["floor"] is not None and list(r["reset"]) == ["recreate"], r
    assert docker_r["floor_argv"][-2].startswith("drumsbench-task:")  # docker run --rm IMAGE true
    assert "/overlay2/" in overlay_r["floor_argv"][-1]  # the image's own layer folders, not the base rootfs
    bad = cli("coldstart", "--tasks", f"harbor:{EXAMPLES}", "--substrate", "process", "--out", str(tmp_path / "runs"),
              env=env)
    assert bad.returncode == 2 and "cannot build" in bad.stderr and "Traceback" not in bad.stderr


def test_the_tasks_agent_timeout_limits_the_episode(sub: Substrate, tmp_path: Path) -> None:
    """``[agent] timeout_sec`` bounds the episode when it is shorter than the run's: an oracle that
    first waits past it ends failed (the policy's time, in a live sandbox), naming the task's limit;
    the same plan under the example's own limit succeeds."""
    folder = _copy(tmp_path, "fix-slug")
    toml = folder / "task.toml"
    text = toml.read_text()
    head, sep, rest = text.partition("[agent]")
    line = next(x for x in rest.splitlines() if x.startswith("timeout_sec"))
    toml.write_text(head + sep + rest.replace(line, "timeout_sec = 3.0", 1))
    (short,) = load_suite(str(folder.parent))
    assert short.agent_timeout == 3.0
    slow = Plan([sh("sleep 2"), sh("sleep 2"), *[a for a in _task("fix-slug").oracle_plan() if a.kind != SUBMIT]])
    got = attempt(sub, short, slow)
    assert got.outcome is Outcome.FAILED and "the task's [agent] timeout" in got.detail, (got.outcome, got.detail)
    assert attempt(sub, _task("fix-slug"), slow).outcome is Outcome.SUCCESS


def test_peer_harbors_own_template_scores_as_harbor_says(sub: Substrate, tmp_path: Path) -> None:
    """Harbor's own ``harbor tasks init`` (its content made at test time, never committed), with its
    registry images replaced by this machine's (the verifier's packages pip-installed instead of by
    uv from ghcr.io): its test is a placeholder that passes, so Harbor scores its oracle and its nop
    1 — and so does this kind, through its stricter verifier (separate mode: the verifier's own image)."""
    import os
    import subprocess

    harbor = Path(str(interpreter.harbor_python())).with_name("harbor")
    subprocess.run([str(harbor), "tasks", "init", "drums/peer", "-p", str(tmp_path)], check=True, timeout=120,
                   env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, capture_output=True)
    task_dir = tmp_path / "peer"
    (task_dir / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (task_dir / "tests" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nRUN python3 -m pip install --no-cache-dir pytest==8.4.1 pytest-json-ctrf==0.3.5\n"
        "WORKDIR /app\nCOPY . /tests/\n")
    (peer,) = load_suite(str(task_dir))
    assert peer.separate
    for policy in ("oracle", "null"):
        rec = attempt(sub, peer, make_policy(policy))
        assert rec.outcome is Outcome.SUCCESS, (policy, rec.outcome, rec.cause, rec.detail)
        assert rec.extra.get("verifier_evidence") == {"reward": 1.0}
