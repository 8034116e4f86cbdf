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


def test_a_folder_named_like_a_builtin_does_not_shadow_it(tmp_path, monkeypatch):
    """An out folder called ``desktop`` or ``coding`` in the working folder (as `--out desktop` makes) must not
    turn `--tasks desktop` into that folder; ``./coding`` still means the folder."""
    from drumsbench.envs import suites
    from drumsbench.envs.coding.task import BUILTIN_ROOT, suite_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "coding").mkdir()
    (tmp_path / "desktop").mkdir()
    assert suite_dir("coding") == BUILTIN_ROOT / "coding"
    assert suites.suite_kind("desktop") == "desktop"
    assert len(load_suite("coding")) >= 10
    assert suite_dir("./coding").resolve() == tmp_path / "coding"
    with pytest.raises(UsageError, match="holds no"):
        load_suite("./coding")
