"""Task suites load, validate, and reject malformed input with a one-line error."""

import shutil

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.envs.coding.task import load_suite

from helpers import MINI


def test_builtin_suite_shape():
    tasks = load_suite("coding")
    assert len(tasks) >= 12
    projects = {t.spec.project for t in tasks}
    assert len(projects) >= 3
    for t in tasks:
        assert t.hidden and t.golden_patch and t.wrong_patches
        # hidden tests are not part of the start state the policy sees
        assert not set(t.hidden) & {p.rsplit("/", 1)[-1] for p in t.files}


def _copy(tmp_path):
    dst = tmp_path / "suite"
    shutil.copytree(MINI, dst)
    return dst


@pytest.mark.parametrize("edit,needle", [
    (lambda s: s.replace('id = "add-sign"', 'id = "Add Sign"'), "field 'id'"),
    (lambda s: s + "\nunknown_field = 1\n", "unknown_field"),
    (lambda s: s.replace('project = "calc"', 'project = "nope"'), "field 'project'"),
    (lambda s: s.replace("sha256:4", "sha256:5"), "start_fingerprint"),
    (lambda s: s.replace('hidden_tests = ["hidden/test_add.py"]', 'hidden_tests = ["hidden/missing.py"]'),
     "hidden_tests"),
    (lambda s: s.replace("=", "", 1), "not valid TOML"),
])
def test_malformed_task_toml(tmp_path, edit, needle):
    suite = _copy(tmp_path)
    toml = suite / "add-sign" / "task.toml"
    toml.write_text(edit(toml.read_text()))
    with pytest.raises(UsageError, match=needle):
        load_suite(str(suite))
