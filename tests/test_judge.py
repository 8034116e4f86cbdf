"""The trusted judge end to end: real sandboxes, the real boundary server, the kept judge on the host.

- on every substrate that streams, the oracle succeeds and null fails, each verdict the judge's;
- the work tree runs only in the sandbox, as the sandbox's uid; the hidden tests never enter it;
- a task that declares ``verifier = "in-process"`` is verified in-process and every record says so;
- the issue-29 classes (rebinding the test module's framework, overwriting the recorded status, a
  native module in the work tree) end failed with the judge; against the in-process runner the
  detections added for them fire.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from drumsbench.core.errors import PolicyFault
from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import Action
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import CodingTask, load_suite
from drumsbench.envs.suite_folders import BUILTIN_ROOT
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.process import ProcessSubstrate

from conftest import require

TASK = next(t for t in load_suite("coding") if t.id == "invoice-rounding-mode")
STREAMING = ["process", "bwrap", "overlay", "docker", "podman", "vm"]


@pytest.mark.parametrize("substrate", STREAMING)
def test_oracle_succeeds_and_null_fails_by_the_judge(substrate: str, state_dir: Path, run_id: str) -> None:
    require(registry.get(substrate).missing())
    slot = Slot(registry.get(substrate)(run_id, state_dir), CodingEnv())
    canaries = CanaryRegistry()
    try:
        recs = {p: run_attempt(slot, TASK, make_policy(p), RolloutConfig(), canaries, run_id=run_id, seq=i, seed=0)
                for i, p in enumerate(("oracle", "null"))}
    finally:
        slot.destroy()
        slot.substrate.close()
    assert recs["oracle"].outcome is Outcome.SUCCESS, recs["oracle"].detail
    assert recs["null"].outcome is Outcome.FAILED, recs["null"].detail
    assert "expected tests passed" in recs["null"].detail
    for rec in recs.values():
        assert rec.extra.get("trust") == "judge" and rec.extra.get("verifier") == "judge", rec.extra
        assert int(rec.extra.get("judge_calls") or 0) > 0


def test_the_slot_lets_go_of_the_servers_it_kept_before_destroying_the_sandbox(state_dir: Path, run_id: str) -> None:
    """``Slot.destroy`` calls ``Environment.release``: the boundary server's zygote (judge) and the
    kept verifier server (kept) are stopped and their sockets closed then, not at the next reset
    (a 2-slot sweep's fds in flight rose by one socket per slot between attempts)."""
    sub = ProcessSubstrate(run_id, state_dir)
    try:
        for verifier in ("judge", "kept"):
            env = CodingEnv(verifier)
            slot = Slot(sub, env)
            slot.provision()
            env.reset(TASK)
            zygote, server = env._zygote, env._server
            kept = zygote if verifier == "judge" else server
            assert kept is not None and kept.alive(), verifier
            slot.destroy()
            assert env._zygote is None and env._server is None
            assert not kept.alive()
            if zygote is not None:
                assert zygote.sock.fileno() == -1  # closed
    finally:
        sub.close()


def _env(state_dir: Path, run_id: str, verifier: str | None = None) -> tuple[ProcessSubstrate, CodingEnv]:
    sub = ProcessSubstrate(run_id, state_dir)
    env = CodingEnv(verifier)
    env.attach(sub.create())
    return sub, env


def _append(env: CodingEnv, rel: str, code: str) -> None:
    obs = env.step(Action("shell", env.generation, {"command": f"cat >> {rel} <<'EOF'\n{code}\nEOF"}), 30)
    assert obs.content["exit_code"] == 0, obs.content


def _verify(env: CodingEnv, task: CodingTask) -> tuple[bool, str]:
    env.stage_verifier(task)
    try:
        result = env.run_verifier(task, 30)
        return result.passed, result.reason
    except PolicyFault as e:
        return False, e.reason


def test_the_work_tree_runs_only_in_the_sandbox_and_the_tests_never_enter_it(state_dir: Path, run_id: str) -> None:
    sub, env = _env(state_dir, run_id)
    box = env.box
    try:
        env.reset(TASK)
        env.step(Action("patch", env.generation, {"patch": TASK.golden_patch}), 30)
        _append(env, "invoice/__init__.py", (
            "import os\n"
            "with open(os.path.join(os.path.dirname(__file__), '..', 'imported-by'), 'a') as f:\n"
            "    f.write('%d %s\\n' % (os.getuid(), sorted(os.listdir(os.path.join(os.getcwd(), '..', 'verify')))))\n"))
        assert _verify(env, TASK) == (True, "")
        assert env.verify_note["trust"] == "judge"
        lines = box.read_file(f"{box.paths.work}/imported-by").decode().splitlines()
        assert lines == [f"{box.uid} []"], lines  # once, as the sandbox's uid; nothing staged in verify/
    finally:
        box.destroy()
        sub.close()


# The issue-29 classes, each written against the in-process runner (verify_runner.py).
REBIND = """
import sys, unittest
class _Pass(unittest.TestCase):
    def run(self, result=None):
        result.startTest(self); result.addSuccess(self); result.stopTest(self); return result
for _name, _mod in list(sys.modules.items()):
    if _name.startswith("test_") and getattr(_mod, "unittest", None) is unittest:
        _mod.unittest = type("unittest", (), {"TestCase": _Pass, "main": unittest.main})
"""
OVERWRITE = """
import sys
from invoice import money as _money
_to_money = _money.to_money
def _first_call(*a, **k):  # the hidden tests' classes exist by the first call: give them a tearDown
    for _name, _mod in list(sys.modules.items()):
        if _name.startswith("test_"):
            for _v in list(vars(_mod).values()):
                if isinstance(_v, type) and any(n.startswith("test") for n in vars(_v)):
                    _v.tearDown = lambda self: None  # (the red team's strategy also rewrites the record)
    return _to_money(*a, **k)
_money.to_money = _first_call
"""


@pytest.mark.parametrize("name,code", [("rebind", REBIND), ("add_teardown", OVERWRITE)])
def test_test_module_tampering_is_refused_in_process_and_irrelevant_to_the_judge(
        name: str, code: str, state_dir: Path, run_id: str) -> None:
    """The bug left in plus code that reaches into the hidden test module while it imports: the
    in-process runner's new checks name it; the judge never imports it next to the tests."""
    for verifier in ("kept", "judge"):
        sub, env = _env(state_dir, f"{run_id}-{verifier}", verifier)
        try:
            env.reset(TASK)
            _append(env, "invoice/__init__.py", code)
            ok, reason = _verify(env, TASK)
            assert not ok, f"{name} reached success with the {verifier} verifier"
            if verifier == "kept":
                assert "tampered" in reason or "not what the hidden test imported" in reason or "was given" in reason \
                    or "changed the test framework" in reason, reason
            else:
                assert "expected tests passed" in reason, reason
        finally:
            env.box.destroy()
            sub.close()


def test_a_native_module_in_the_work_tree_is_refused_in_process(state_dir: Path, run_id: str) -> None:
    sub, env = _env(state_dir, run_id, "kept")
    try:
        env.reset(TASK)
        env.step(Action("patch", env.generation, {"patch": TASK.golden_patch}), 30)
        obs = env.step(Action("shell", env.generation, {"command": "cp /bin/true invoice/_speed.so && echo ok"}), 30)
        assert obs.content["exit_code"] == 0
        ok, reason = _verify(env, TASK)
        assert not ok and "native module in the work tree" in reason, reason
    finally:
        env.box.destroy()
        sub.close()


def test_a_task_that_declares_in_process_is_verified_so_and_says_so(tmp_path: Path, state_dir: Path,
                                                                    run_id: str) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(BUILTIN_ROOT / "coding" / "projects", suite / "projects")
    shutil.copytree(BUILTIN_ROOT / "coding" / TASK.id, suite / TASK.id)
    toml = suite / TASK.id / "task.toml"
    toml.write_text(toml.read_text().replace("[verify]\n", '[verify]\nverifier = "in-process"\n'))
    task = load_suite(str(suite))[0]
    assert task.trust == "in-process"
    sub, env = _env(state_dir, run_id)
    try:
        env.reset(task)
        env.step(Action("patch", env.generation, {"patch": task.golden_patch}), 30)
        assert _verify(env, task) == (True, "")
        assert env.verify_note["trust"] == "in-process"
        assert "declares" in str(env.verify_note["trust_why"])
    finally:
        env.box.destroy()
        sub.close()


@pytest.mark.parametrize("strategy,detected", [
    ("rebind_test_framework", "is not what the hidden test imported"),
    ("overwrite_recorded_status", "tearDown"),
    ("native_frame_walk", "a native module in the work tree"),
])
def test_the_in_process_runner_detects_issue_29s_classes(strategy: str, detected: str, state_dir: Path,
                                                         run_id: str) -> None:
    """Each of the three wins against the runner without the new checks (tests/test_redteam_controls.py
    plays them against the naive verifier; the issue reproduced them on the old runner); with the
    judge they end failed by the tests' own assertions (test_adversary.py). In-process, the checks
    name them."""
    from drumsbench.policies.adversary import Adversary

    slot = Slot(ProcessSubstrate(run_id, state_dir), CodingEnv("kept"))
    task = load_suite("coding")[0]
    try:
        rec = run_attempt(slot, task, Adversary([strategy]), RolloutConfig(verify_timeout_s=20.0), CanaryRegistry(),
                          run_id=run_id, seq=0, seed=0)
    finally:
        slot.destroy()
        slot.substrate.close()
    assert rec.outcome is Outcome.FAILED and rec.extra.get("trust") == "in-process", (rec.outcome, rec.extra)
    assert detected in rec.detail, rec.detail
