"""The kept and warm verifiers (``CodingEnv(verifier="kept"|"warm")``): the same verdicts as the
cold one, and the policy's attacks aimed at them neither forge a success nor escape into invalid.

Each attack has a positive control: the same attack against a verifier with the one protection
removed (the work tree on the prepared interpreter's path, no ``-I``, no ``end_processes`` before
it starts) must succeed in forging or escaping, so the test would fail if the protection went.
Runs on the real ``process`` substrate."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.coding import env as coding_env
from drumsbench.envs.coding.env import RUNNER, VERIFIER_VAR, CodingEnv, runner_stdin
from drumsbench.envs.coding.task import CodingTask, load_suite
from drumsbench.policies.scripted import Policy, make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import ExecResult
from drumsbench.substrates.process import ProcessSubstrate

CFG = RolloutConfig(step_timeout_s=10.0, episode_timeout_s=120.0, verify_timeout_s=30.0, max_steps=20)
TASKS = load_suite("coding")

# Run at import of the code under test (in the verifier's child): report every hidden test passed,
# with the nonce that ``secrets.token_hex`` gives now — the real one only if an attack made the
# verifier's own ``secrets`` the policy's. Then end the child before the real tests run.
FORGER = """
import ast, glob, json, os, secrets
_n = secrets.token_hex(16)
_ids = []
for _f in sorted(glob.glob(os.path.join(os.getcwd(), "..", "verify", "tests", "*.py"))):
    _mod = os.path.basename(_f)[:-3]
    for _c in ast.parse(open(_f).read()).body:
        if isinstance(_c, ast.ClassDef):
            _ids += [f"{_mod}.{_c.name}.{_m.name}" for _m in _c.body
                     if isinstance(_m, ast.FunctionDef) and _m.name.startswith("test")]
_msgs = [{"ev": "test", "id": _i, "status": "pass", "n": _n} for _i in _ids] + [{"ev": "done", "n": _n}]
for _fd in range(3, 64):
    try:
        os.write(_fd, "".join(json.dumps(_m) + "\\n" for _m in _msgs).encode())
    except OSError:
        pass
os._exit(0)
"""
CONSTANT_NONCE = 'def token_hex(nbytes=16):\n    return "0" * (2 * nbytes)\n'
PATCH_SECRETS = 'import secrets; secrets.token_hex = lambda nbytes=16: "0" * (2 * nbytes)'
# Modules the prepared interpreter imports, shadowed by files that would end it before READY.
CRASHERS = ("json", "types", "unittest", "ast", "hmac", "hashlib", "select", "signal", "subprocess",
            "ctypes", "time", "secrets")


class Scripted(Policy):
    def __init__(self, name: str, actions: list[ActionSpec], solve: bool = False) -> None:
        super().__init__()
        self.name, self.actions, self.solve = name, actions, solve

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        fix = [a for a in task.oracle_plan() if a.kind != SUBMIT] if self.solve else []
        return [*self.actions, *fix, ActionSpec(SUBMIT)]


def _shell(command: str) -> ActionSpec:
    return ActionSpec("shell", {"command": command})


def _append_forger(task: CodingTask) -> list[ActionSpec]:
    inits = sorted(p for p in task.files if p.endswith("__init__.py"))
    assert inits, "the task has a package whose import runs the forger"
    return [_shell(f"cat >> {p} <<'EOF'\n{FORGER}\nEOF") for p in inits]


def _shadow_secrets(task: CodingTask) -> list[ActionSpec]:
    return [ActionSpec("write", {"path": "secrets.py", "content": CONSTANT_NONCE}), *_append_forger(task)]


def _shadow_crashers(task: CodingTask) -> list[ActionSpec]:
    return [ActionSpec("write", {"path": f"{m}.py", "content": "import os\nos._exit(0)\n"}) for m in CRASHERS]


def _customize(task: CodingTask) -> list[ActionSpec]:
    """sitecustomize, usercustomize and a .pth in the work tree, home and the user site."""
    code = PATCH_SECRETS  # no single quote: it goes into the shell's single quotes
    plant = ('d=$(python3 -c "import site; print(site.getusersitepackages())") && mkdir -p "$d" && '
             f"for f in \"$d/usercustomize.py\" \"$d/sitecustomize.py\" ./sitecustomize.py ./usercustomize.py "
             f"\"$HOME/sitecustomize.py\"; do printf '%s\\n' '{code}' > \"$f\"; done && "
             f"printf '%s\\n' '{code}' > \"$d/zz-drumsbench.pth\" && printf '%s\\n' '{code}' > ./zz.pth && ls \"$d\"")
    return [_shell(plant), *_append_forger(task)]


KILLER = _shell("setsid nohup sh -c 'while :; do pkill -9 -u $(id -u) -f [v]erify/runner.py; done' "
                ">/dev/null 2>&1 &")


class _OnPath(CodingEnv):
    """Protection removed: the prepared interpreter has the work tree first on its path."""

    def _exec_runner(self, secret: bytes, config: dict[str, Any], timeout: float, *, warm: bool) -> ExecResult:
        runner = f"{self.box.paths.verify}/runner.py"
        boot = (f"import sys; sys.path.insert(0, {self.box.paths.work!r}); "
                f"exec(compile(open({runner!r}).read(), {runner!r}, 'exec'))")
        return self.box.exec(["python3", "-I", "-c", boot, "--warm", self.box.paths.verify], timeout=timeout,
                             stdin=runner_stdin(secret, config))


class _NotIsolated(CodingEnv):
    """Protection removed: the prepared interpreter runs without ``-I`` (user site, PYTHON* on)."""

    def _exec_runner(self, secret: bytes, config: dict[str, Any], timeout: float, *, warm: bool) -> ExecResult:
        return self.box.exec(["python3", f"{self.box.paths.verify}/runner.py", "--warm", self.box.paths.verify],
                             timeout=timeout,
                             stdin=runner_stdin(secret, config))


class _NoEnd(CodingEnv):
    """Protection removed: what the policy left running survives into verification."""

    def stage_verifier(self, task: Task) -> None:
        assert isinstance(task, CodingTask)
        files = {"runner.py": RUNNER, **{f"tests/{name}": data for name, data in task.hidden.items()}}
        self.box.put_files(self.box.paths.verify, files)


def _attempt(env: CodingEnv, policy: Policy, state_dir, run_id: str, task: CodingTask = TASKS[0], seq: int = 0):
    slot = Slot(ProcessSubstrate(run_id, state_dir), env)
    try:
        return run_attempt(slot, task, policy, CFG, CanaryRegistry(), run_id=run_id, seq=seq, seed=0)
    finally:
        slot.destroy()
        slot.substrate.close()


def test_kept_warm_and_cold_give_the_same_verdict_on_every_coding_task(state_dir, run_id):
    slots = {mode: Slot(ProcessSubstrate(f"{run_id}{mode[0]}", state_dir), CodingEnv(mode))
             for mode in ("kept", "warm", "cold")}
    canaries, seen, decided = CanaryRegistry(), {}, set()
    try:
        for i, task in enumerate(TASKS):
            for policy in ("oracle", "null"):
                for mode, slot in slots.items():
                    rec = run_attempt(slot, task, make_policy(policy), CFG, canaries, run_id=run_id, seq=i, seed=0)
                    seen[(task.id, policy, mode)] = (rec.outcome, rec.detail)
                    decided.add((mode, rec.extra["verifier"]))
    finally:
        for slot in slots.values():
            slot.destroy()
            slot.substrate.close()
    for task in TASKS:
        for policy, want in (("oracle", Outcome.SUCCESS), ("null", Outcome.FAILED)):
            kept, warm, cold = (seen[(task.id, policy, m)] for m in ("kept", "warm", "cold"))
            assert kept == warm == cold, f"{task.id} {policy}: kept {kept}, warm {warm}, cold {cold}"
            assert warm[0] is want, f"{task.id} {policy}: {warm}"
    assert decided == {("kept", "kept"), ("warm", "warm"), ("cold", "cold")}, decided
    assert slots["warm"].env.fallbacks == [] and slots["kept"].env.fallbacks == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("attack", ["shadow_secrets", "customize"])
def test_the_forging_attacks_forge_only_without_the_protection(attack, state_dir, run_id):
    make = {"shadow_secrets": _shadow_secrets, "customize": _customize}[attack]
    actions = make(TASKS[0])
    for mode in ("kept", "warm"):
        guarded = _attempt(CodingEnv(mode), Scripted(attack, actions), state_dir, run_id + mode[0])
        assert guarded.outcome is Outcome.FAILED, (mode, guarded.outcome, guarded.cause, guarded.detail)
        assert guarded.extra["verifier"] == mode, guarded.extra
    cold = _attempt(CodingEnv("cold"), Scripted(attack, actions), state_dir, run_id + "c")
    assert cold.outcome is Outcome.FAILED, (cold.outcome, cold.cause, cold.detail)
    # positive control: the same actions forge a success once the one protection is removed
    weakened = {"shadow_secrets": _OnPath, "customize": _NotIsolated}[attack]("warm")
    forged = _attempt(weakened, Scripted(attack, actions), state_dir, run_id + "p")
    assert forged.outcome is Outcome.SUCCESS, (forged.outcome, forged.cause, forged.detail)


def test_shadowing_the_verifiers_imports_is_no_escape_into_invalid(state_dir, run_id):
    actions = _shadow_crashers(TASKS[0])
    for mode in ("kept", "warm"):
        for policy in (Scripted("shadow", actions), Scripted("shadow+fix", actions, solve=True)):
            rec = _attempt(CodingEnv(mode), policy, state_dir, run_id)
            want = Outcome.SUCCESS if policy.name == "shadow+fix" else Outcome.FAILED
            assert rec.outcome is want, (mode, policy.name, rec.outcome, rec.cause, rec.detail)
    escaped = _attempt(_OnPath("warm"), Scripted("shadow", actions), state_dir, run_id + "p")
    assert escaped.outcome is Outcome.INVALID, (escaped.outcome, escaped.detail)  # positive control


def _killer_changes_nothing(mode: str, killer: ActionSpec, state_dir, run_id: str) -> None:
    """With ``killer`` in the policy's actions, unsolved fails and solved succeeds, decided by the
    ``mode`` verifier itself (no fallback)."""
    for solve, want in ((False, Outcome.FAILED), (True, Outcome.SUCCESS)):
        env = CodingEnv(mode)
        rec = _attempt(env, Scripted("killer", [killer], solve=solve), state_dir, run_id)
        assert rec.outcome is want, (rec.outcome, rec.cause, rec.detail)
        assert env.fallbacks == [] and rec.extra["verifier"] == mode, rec.extra


def test_a_killer_left_running_cannot_reach_the_warm_runner(state_dir, run_id):
    _killer_changes_nothing("warm", KILLER, state_dir, run_id)
    env = _NoEnd("warm")
    escaped = _attempt(env, Scripted("killer", [KILLER]), state_dir, run_id + "p")
    assert (escaped.outcome, escaped.cause) == (Outcome.INVALID, InvalidCause.VERIFIER_UNAVAILABLE), escaped.detail
    assert len(env.fallbacks) == 1  # positive control: the killer got the warm runner, then the cold one
    # the ledger's record says so
    assert escaped.extra["verifier"] == "cold" and "warm runner exit" in str(escaped.extra["verifier_fallback"])


def _staged(state_dir, run_id: str, oracle: bool, verifier: str = "warm") -> tuple[ProcessSubstrate, CodingEnv]:
    sub = ProcessSubstrate(run_id, state_dir)
    env = CodingEnv(verifier)
    env.attach(sub.create())
    task = TASKS[0]
    env.reset(task)
    if oracle:
        for spec in task.oracle_plan():
            if spec.kind != SUBMIT:
                env.step(env_action(env, spec), 30)
    env.stage_verifier(task)
    return sub, env


def env_action(env: CodingEnv, spec: ActionSpec):
    from drumsbench.envs.base import Action

    return Action.of(spec, env.generation)


def test_a_warm_runner_that_cannot_start_falls_back_to_cold_and_says_so(state_dir, run_id):
    sub, env = _staged(state_dir, run_id, oracle=True)
    try:
        runner = f"{env.box.paths.verify}/runner.py"
        env.box.write_file(runner, b'import sys\nif "--warm" in sys.argv:\n    raise SystemExit(3)\n' + RUNNER)
        assert env.run_verifier(TASKS[0], 30).passed is True
        assert len(env.fallbacks) == 1 and "exit 3" in env.fallbacks[0]
        assert _way(env.verify_note) == {"verifier": "cold", "verifier_fallback": env.fallbacks[0]}
        env.break_verifier()  # both broken: infrastructure, as the cold verifier alone says
        with pytest.raises(coding_env.InvalidAttempt) as e:
            env.run_verifier(TASKS[0], 30)
        assert e.value.cause is InvalidCause.VERIFIER_UNAVAILABLE
        assert len(env.fallbacks) == 2
    finally:
        env.box.destroy()
        sub.close()


def _way(note: dict) -> dict:
    """How the in-process runner decided, without the trust level every in-process note carries."""
    assert note.get("trust") == "in-process", note
    return {k: v for k, v in note.items() if not k.startswith("trust")}


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv(VERIFIER_VAR, "cold")
    assert CodingEnv().verifier == "cold"
    monkeypatch.delenv(VERIFIER_VAR)
    assert CodingEnv().verifier == "judge"
    monkeypatch.setenv(VERIFIER_VAR, "lukewarm")
    with pytest.raises(UsageError, match=VERIFIER_VAR):
        CodingEnv()
    with pytest.raises(UsageError, match="verifier='tepid'"):
        CodingEnv("tepid")


def test_the_run_report_groups_attempts_by_verifier(tmp_path, state_dir):
    """The real command's ledger: every attempt says which verifier decided it, and the run report
    (JSON, rebuilt from the ledger alone, and the terminal) groups them with the verify latency."""
    from helpers import cli

    env = {"DRUMSBENCH_STATE": str(state_dir)}
    seen = {}
    bad = cli("run", "--verifier", "tepid", "--out", str(tmp_path / "bad"), env=env)
    assert bad.returncode == 2 and "--verifier: 'tepid' is not one of judge, kept, warm, cold" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "bad").exists()  # checked before anything is made
    for mode in ("judge", "kept", "cold"):
        out = tmp_path / mode
        # the environment variable, or the flag (which wins over it)
        how = {"env": {**env, VERIFIER_VAR: mode}} if mode == "kept" else \
            {"env": {**env, VERIFIER_VAR: "warm"}, "flag": ["--verifier", mode]}
        proc = cli("run", "--tasks", "coding", "--attempts", "4", "--concurrency", "2", "--pool", "off",
                   "--out", str(out), "--json", str(out / "r.json"), "--no-progress", *how.get("flag", []),
                   env=how["env"], check=True)
        report = json.loads((out / "r.json").read_text())
        (way,) = [w for w in report["ways"] if w["aspect"] == "verifier"]
        assert (way["way"], way["attempts"], way["invalid"]) == (mode, report["attempts"], 0), report["ways"]
        assert way["latency"]["n"] == report["attempts"] >= 4 and way["latency"]["p50"]["value"] > 0
        assert "how attempts ran" in proc.stdout
        trust = "judge" if mode == "judge" else "in-process"
        assert report["trust"] == {trust: report["valid"]}, report["trust"]
        judged = report["valid"] if mode == "judge" else 0
        assert f"{judged} of {report['valid']} verdicts from a trusted judge" in proc.stdout
        rebuilt = cli("report", report["run_id"], "--out", str(out), "--json", str(out / "again.json"), env=env,
                      check=True)
        assert json.loads((out / "again.json").read_text())["ways"] == report["ways"], rebuilt.stdout
        seen[mode] = way
    assert len({w["way"] for w in seen.values()}) == 3


# -- the kept server: started at reset, alive through the policy's turn ---------------------------------
SERVER_KILLER = _shell("setsid nohup sh -c 'while :; do pkill -9 -f -- --serve; kill -9 -1; done' "
                       ">/dev/null 2>&1 & sleep 0.5; pkill -0 -f -- --serve && echo the server is up")


class _ServerAsSandboxUid(CodingEnv):
    """Protection removed: the kept server runs as the sandbox's own uid, not the harness's."""

    def _server_argv(self, paths, uid: int) -> list[str]:
        return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                *super()._server_argv(paths, uid)]


class _NoDrop(CodingEnv):
    """Protection removed: the kept server's child stays root (it "drops" to uid 0)."""

    def _server_argv(self, paths, uid: int) -> list[str]:
        return super()._server_argv(paths, 0)


def test_a_killer_in_the_policys_turn_cannot_reach_the_kept_server(state_dir, run_id):
    _killer_changes_nothing("kept", SERVER_KILLER, state_dir, run_id)
    # positive control: a server of the sandbox's uid is killed by the same actions; the verdict
    # then comes from the per-verification runner, and the record says so
    env = _ServerAsSandboxUid("kept")
    rec = _attempt(env, Scripted("killer", [SERVER_KILLER], solve=True), state_dir, run_id + "p")
    assert rec.outcome is Outcome.SUCCESS, (rec.outcome, rec.cause, rec.detail)
    assert rec.extra == {**rec.extra, "verifier": "warm", "verifier_fallback": "the kept server had ended"}, rec.extra


UID_PROBE = ('import os\nwith open(os.path.join(os.environ["TMPDIR"], "uid-seen"), "w") as _f:\n'
             '    _f.write(str(os.getuid()))\n')


@pytest.mark.parametrize("env_class", [CodingEnv, _NoDrop])
def test_the_kept_servers_child_runs_the_code_as_the_sandboxs_uid(env_class, state_dir, run_id):
    sub = ProcessSubstrate(run_id, state_dir)
    env = env_class("kept")
    box = sub.create()
    env.attach(box)
    task = TASKS[0]
    try:
        env.reset(task)
        (init,) = sorted(p for p in task.files if p.endswith("__init__.py"))[:1]
        env.step(env_action(env, ActionSpec("shell", {"command": f"cat >> {init} <<'EOF'\n{UID_PROBE}EOF"})), 30)
        env.stage_verifier(task)
        result = env.run_verifier(task, 30)  # the bug is not fixed: failed, with the reason
        assert not result.passed and result.reason.startswith("verifier: "), result
        assert _way(env.verify_note) == {"verifier": "kept"}
        seen = int(box.read_file(f"{box.paths.tmp}/uid-seen"))
        # the positive control: without the drop, the code under test runs as root
        assert seen == (0 if env_class is _NoDrop else box.uid), seen
    finally:
        box.destroy()
        sub.close()


def test_fault_injection_breaks_the_kept_server_too(state_dir, run_id):
    sub, env = _staged(state_dir, run_id, oracle=True, verifier="kept")
    try:
        assert env.run_verifier(TASKS[0], 30).passed is True and _way(env.verify_note) == {"verifier": "kept"}
        env.break_verifier()  # from the host: the server killed, the runner damaged
        with pytest.raises(coding_env.InvalidAttempt) as e:
            env.run_verifier(TASKS[0], 30)
        assert e.value.cause is InvalidCause.VERIFIER_UNAVAILABLE
        # the server is found dead, or dies under the request: either way it did not decide
        assert "kept server" in env.fallbacks[0] and len(env.fallbacks) == 2, env.fallbacks
    finally:
        env.box.destroy()
        sub.close()
