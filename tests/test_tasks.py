"""Task suites load, validate, and reject malformed input with a one-line error."""

import os
import shutil
from pathlib import Path

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.envs.coding.task import compute_fingerprints, load_suite

from helpers import MINI, one_task_suite


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
    from drumsbench.envs.suite_folders import BUILTIN_ROOT, suite_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "coding").mkdir()
    (tmp_path / "desktop").mkdir()
    assert suite_dir("coding") == BUILTIN_ROOT / "coding"
    assert suites.suite_kind("desktop") == "desktop"
    assert len(load_suite("coding")) >= 10
    assert suite_dir("./coding").resolve() == tmp_path / "coding"
    with pytest.raises(UsageError, match="holds no"):
        load_suite("./coding")


TASK = "textstats-empty-summary"


def _host(tmp_path: Path) -> Path:
    """A host folder outside the suite, with a file a task must never reach."""
    host = tmp_path / "host"
    host.mkdir(exist_ok=True)
    (host / "secret.py").write_text("TOKEN = 'host'\n")
    return host


def _set(suite: Path, old: str, new: str) -> None:
    toml = suite / TASK / "task.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new))


def _link_project_to_host_folder(suite, tmp_path):
    os.symlink(_host(tmp_path), suite / "projects" / "textstats" / "hostdir")


def _link_project_file_to_host(suite, tmp_path):
    os.symlink(_host(tmp_path) / "secret.py", suite / "projects" / "textstats" / "textstats" / "secret.py")


def _link_hidden_test_to_host(suite, tmp_path):
    (suite / TASK / "hidden" / "test_empty_summary.py").unlink()
    os.symlink(_host(tmp_path) / "secret.py", suite / TASK / "hidden" / "test_empty_summary.py")


def _link_task_folder_to_host(suite, tmp_path):
    shutil.move(suite / TASK, tmp_path / "moved")
    os.symlink(tmp_path / "moved", suite / TASK)


def _link_project_folder_to_host(suite, tmp_path):
    shutil.move(suite / "projects" / "textstats", tmp_path / "moved")
    os.symlink(tmp_path / "moved", suite / "projects" / "textstats")


def _dangling_link(suite, tmp_path):
    os.symlink(tmp_path / "nowhere", suite / "projects" / "textstats" / "gone")


def _fifo_in_project(suite, tmp_path):
    os.mkfifo(suite / "projects" / "textstats" / "pipe")


def _fifo_as_bug_patch(suite, tmp_path):
    (suite / TASK / "bug.patch").unlink()
    os.mkfifo(suite / TASK / "bug.patch")


def _non_utf8(rel):
    def damage(suite, tmp_path):
        path = suite / rel
        path.write_bytes(path.read_bytes() + b"\n# caf\xe9\n")
    damage.__name__ = f"non_utf8_{Path(rel).name}"
    return damage


def _too_large_hidden_test(suite, tmp_path):
    path = suite / TASK / "hidden" / "test_empty_summary.py"
    path.write_text(path.read_text() + "#" * (1 << 20) + "\n")


def _bug_patch_outside(suite, tmp_path):
    _host(tmp_path)
    _set(suite, 'bug_patch = "bug.patch"', 'bug_patch = "../../host/secret.py"')


def _bug_patch_absolute(suite, tmp_path):
    _set(suite, 'bug_patch = "bug.patch"', f'bug_patch = "{_host(tmp_path) / "secret.py"}"')


def _project_parent(suite, tmp_path):
    _set(suite, 'project = "textstats"', 'project = ".."')


def _hidden_test_is_a_folder(suite, tmp_path):
    _set(suite, 'hidden_tests = ["hidden/test_empty_summary.py"]', 'hidden_tests = ["hidden/test_dir.py"]')
    (suite / TASK / "hidden" / "test_dir.py").mkdir()


def _missing_field(suite, tmp_path):
    _set(suite, 'golden_patch = "golden.patch"', "")


def _patch_makes_a_symlink(suite, tmp_path):
    # a bug.patch that also adds textstats/hostlink -> the host's secret (git diff of a symlink)
    link = f"{_host(tmp_path) / 'secret.py'}"
    path = suite / TASK / "bug.patch"
    path.write_text(path.read_text() + (
        "diff --git a/textstats/hostlink b/textstats/hostlink\nnew file mode 120000\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ b/textstats/hostlink\n@@ -0,0 +1 @@\n+{link}\n\\ No newline at end of file\n"))


BAD_FOLDERS = [
    (_link_project_to_host_folder, "a symlink to", True),
    (_link_project_file_to_host, "a symlink to", True),
    (_link_hidden_test_to_host, "a symlink to", False),
    (_link_task_folder_to_host, "a symlink to", True),
    (_link_project_folder_to_host, "leads outside", True),
    (_dangling_link, "does not resolve", True),
    (_fifo_in_project, "is a FIFO", True),
    (_fifo_as_bug_patch, "is a FIFO", True),
    (_non_utf8(f"{TASK}/task.toml"), "not UTF-8", True),
    (_non_utf8(f"{TASK}/bug.patch"), "not UTF-8", True),
    (_non_utf8(f"{TASK}/golden.patch"), "not UTF-8", False),
    (_non_utf8(f"{TASK}/hidden/test_empty_summary.py"), "not UTF-8", False),
    (_too_large_hidden_test, "over the limit", False),
    (_bug_patch_outside, "leads outside", True),
    (_bug_patch_absolute, "is an absolute path", True),
    (_project_parent, "field 'project'", True),
    (_hidden_test_is_a_folder, "is a folder", False),
    (_missing_field, "field 'golden_patch'", False),
    (_patch_makes_a_symlink, "creates the symlink", True),
]


@pytest.mark.parametrize("damage,needle,fingerprint", BAD_FOLDERS, ids=[d[0].__name__.strip("_") for d in BAD_FOLDERS])
def test_a_task_folder_reaching_outside_or_unreadable_is_refused_in_one_line(tmp_path, damage, needle, fingerprint):
    """Nothing a suite names or holds reaches outside it, and every bad file is one line naming it
    (the CLI's exit 2 and one line: test_cli.py). ``fingerprint``: the check also guards
    ``tasks fingerprint``, which reads task.toml, the bug patch and the project only."""
    suite = one_task_suite(tmp_path)
    damage(suite, tmp_path)
    with pytest.raises(UsageError, match=needle) as err:
        load_suite(str(suite))
    assert "\n" not in str(err.value)
    if fingerprint:
        with pytest.raises(UsageError, match=needle):
            compute_fingerprints(str(suite))


def test_a_symlink_inside_its_own_folder_is_read_as_the_file(tmp_path):
    """A link that stays in its folder is not an escape: it is read as the file it points to."""
    suite = one_task_suite(tmp_path)
    hidden = suite / TASK / "hidden"
    shutil.move(hidden / "test_empty_summary.py", suite / TASK / "real_test.py")
    os.symlink("../real_test.py", hidden / "test_empty_summary.py")
    task = load_suite(str(suite))[0]
    assert task.hidden["test_empty_summary.py"] == (suite / TASK / "real_test.py").read_bytes()
