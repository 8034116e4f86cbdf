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
from helpers import MINI, cli, one_task_suite, slot_on

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
    # the hidden tests' own imports are the trusted judge's, on the host: nothing the policy can touch
    assert "the judge's Python lacks" in rec.detail and rec.extra.get("trust") == "judge", rec.detail


def test_a_good_suite_passes_the_check():
    proc = cli("tasks", "check", MINI, "--substrates", "process")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 7 environment checks, the data checks of 1 project and 1 task, 1 task on the image
    assert "10 of 10 checks passed (coding environment, process)" in proc.stdout
    assert "ok   process  env stale_action" in proc.stdout
    assert "verdicts by: judge" in proc.stdout


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


# A coin flip: fails about half the time whatever the code under test does (a test that depends on
# timing, ordering or a shared resource, as real suites' flaky tests do).
FLAKY = """

class ZFlakyTest(unittest.TestCase):
    def test_coin(self):
        import os
        self.assertLess(os.urandom(1)[0], 128, "lost the coin flip")
"""


def test_a_flaky_hidden_test_is_refused_by_check_naming_it(tmp_path):
    """A hidden test that fails at random on the golden fix is refused, named. With p = 1/2 and 30
    runs of the golden state, all 30 agree with probability 2**-29: this test does not flake."""
    suite = one_task_suite(tmp_path)
    hidden = suite / "textstats-empty-summary" / "hidden" / "test_empty_summary.py"
    hidden.write_text(hidden.read_text() + FLAKY)
    proc = cli("tasks", "check", str(suite), "--substrate", "process", "--repeat", "30")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # (the environment checker's oracle and the host's data checks may see the coin flip too)
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL process  textstats-empty-summary:")]
    assert "FAIL process  textstats-empty-summary: flaky: the verdict on the golden state changed between 30 runs" \
        in line, proc.stdout
    assert "(flaky test: test_empty_summary.ZFlakyTest.test_coin)" in line, line
    assert "x 'passed'" in line, line  # how often each verdict came
    assert proc.stdout.rstrip().endswith("(coding environment, process)")


def test_a_repeat_below_1_is_one_line_exit_2():
    proc = cli("tasks", "check", MINI, "--substrate", "process", "--repeat", "0")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --repeat: 0 runs check nothing"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("verdicts,problem", [
    (["passed"] * 5, ""),
    (["failed: verifier: 1 of 3 expected tests passed; t.A.test_x: fail"] * 5, ""),
    (["passed", "failed: verifier: 2 of 3 expected tests passed; t.A.test_x: fail", "passed"],
     "flaky test: t.A.test_x)"),
    (["failed: verifier: 1 of 3 expected tests passed; t.A.test_x: fail",
      "failed: verifier: 0 of 3 expected tests passed; t.A.test_x: fail"],
     "flaky test: not named: the verifier names only the first test that did not pass (t.A.test_x) in every run"),
])
def test_flaky_problem_names_the_test_that_changes(verdicts, problem):
    from drumsbench.experiments.taskcheck import flaky_problem

    got = flaky_problem("golden", verdicts)
    assert (problem in got) if problem else got == "", got
    assert "\n" not in got
