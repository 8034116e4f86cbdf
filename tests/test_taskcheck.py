"""A verifier that checked nothing, or could not check, is never a 0: ``tasks check`` refuses a task
whose hidden tests need a module the image lacks, the loader refuses duplicate and test-less hidden
files, and at run time such a task is invalid (confirmed in a fresh sandbox), never failed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry

from conftest import require
from helpers import MINI, cli, slot_on

CFG = RolloutConfig(step_timeout_s=10, episode_timeout_s=60, verify_timeout_s=20)


def _suite_with_hidden(tmp_path: Path, source: str, extra_toml: str = "") -> Path:
    suite = tmp_path / "suite"
    shutil.copytree(MINI, suite)
    (suite / "add-sign" / "hidden" / "test_add.py").write_text(source)
    if extra_toml:
        toml = suite / "add-sign" / "task.toml"
        toml.write_text(toml.read_text().replace('hidden_tests = ["hidden/test_add.py"]', extra_toml))
    return suite


NEEDS_MISSING = """import unittest

import drumsbench_module_no_image_has

from calc.ops import add


class TestAdd(unittest.TestCase):
    def test_positive(self):
        self.assertEqual(add(2, 3), 5)
"""


@pytest.mark.parametrize("substrate", ["process", "docker"])
def test_missing_module_is_refused_by_check_and_invalid_at_run_time(substrate, tmp_path, state_dir, run_id):
    from drumsbench.substrates import registry

    require(registry.get(substrate).missing())
    suite = _suite_with_hidden(tmp_path, NEEDS_MISSING)
    proc = cli("tasks", "check", str(suite), "--substrates", substrate)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "drumsbench_module_no_image_has" in proc.stdout and "lacks" in proc.stdout

    slot = slot_on(substrate, run_id, state_dir)
    task = load_suite(str(suite))[0]
    try:
        rec = run_attempt(slot, task, make_policy("oracle"), CFG, CanaryRegistry(), run_id=run_id, seq=0, seed=0)
    finally:
        slot.destroy()
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.VERIFIER_UNAVAILABLE), rec.detail
    assert "fresh sandbox lacks it too" in rec.detail


def test_a_good_suite_passes_the_check():
    proc = cli("tasks", "check", MINI, "--substrates", "process")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 7 environment checks, the data checks of 1 project and 1 task, 1 task on the image
    assert "10 of 10 checks passed (coding environment, process)" in proc.stdout
    assert "ok   process  env stale_action" in proc.stdout


def test_a_policy_importing_a_missing_module_is_failed(state_dir, run_id):
    """The policy's own code importing something absent is the policy's failure, not the image's."""
    slot = slot_on("process", run_id, state_dir)
    from drumsbench.policies.adversary import Adversary

    try:
        rec = run_attempt(slot, load_suite(MINI)[0], Adversary(["import_missing_module"]), CFG, CanaryRegistry(),
                          run_id=run_id, seq=0, seed=0)
    finally:
        slot.destroy()
    assert rec.outcome is Outcome.FAILED, rec.detail


@pytest.mark.parametrize("hidden,field_text,message", [
    ("import unittest\n\nclass T(unittest.TestCase):\n    x = 1\n", "", "defines no test method"),
    ("import unittest\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n",
     'hidden_tests = ["hidden/test_add.py", "wrong.patch"]', "not a Python module file name"),
])
def test_loader_refuses_hidden_tests_that_check_nothing(tmp_path, hidden, field_text, message):
    suite = _suite_with_hidden(tmp_path, hidden, field_text)
    proc = cli("tasks", "list", str(suite))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_loader_refuses_two_hidden_files_with_one_name(tmp_path):
    suite = _suite_with_hidden(tmp_path, (Path(MINI) / "add-sign" / "hidden" / "test_add.py").read_text(),
                               'hidden_tests = ["hidden/test_add.py", "more/test_add.py"]')
    (suite / "add-sign" / "more").mkdir()
    shutil.copy(suite / "add-sign" / "hidden" / "test_add.py", suite / "add-sign" / "more" / "test_add.py")
    proc = cli("tasks", "list", str(suite))
    assert proc.returncode == 2 and "two files are named 'test_add.py'" in proc.stderr, proc.stderr
