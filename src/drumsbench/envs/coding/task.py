"""Coding tasks: load and validate a task suite from disk (format: docs/tasks.md).

Contract: ``load_suite(name_or_path)`` returns the suite's tasks sorted by id, each with its start
state in memory and its start fingerprint checked; any problem raises ``UsageError`` naming the
file, the field and the fix. Built-in suites are folders under ``drumsbench/tasks/``. A suite is
untrusted: every file a task names is read inside its task folder, its project inside
``<suite>/projects/<project>``, by the readers of ``suite_folders`` (no symlink leading out, no
special file, size bounds, UTF-8 text); a patch that creates a symlink is refused.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from drumsbench.core.errors import UsageError
from drumsbench.core.fingerprint import files_digest
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.coding import test_style
from drumsbench.envs.suite_folders import (
    StartFingerprint,
    TaskId,
    inside,
    load_folders,
    read_text,
    read_toml,
    read_tree,
    suite_dir,
    task_folders,
)

_SKIP_PARTS = {"__pycache__", ".git"}


class VerifySpec(BaseModel):
    """``[verify]`` of task.toml. ``verifier``: ``judge`` (the default) runs the hidden tests in the
    trusted judge, behind the boundary (docs/attribution.md); ``in-process`` declares tests that must
    share a process with the code under test (e.g. they monkeypatch it): they run in the sandbox with
    the in-process runner's fences, and every report says those verdicts are not from a judge."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(60.0, gt=0)
    verifier: Literal["judge", "in-process"] = "judge"


class TaskSpec(BaseModel):
    """The fields of task.toml."""

    model_config = ConfigDict(extra="forbid")
    id: TaskId
    project: str
    description: str = Field(min_length=1)
    bug_patch: str
    golden_patch: str
    wrong_patches: list[str] = Field(min_length=1)
    hidden_tests: list[str] = Field(min_length=1)
    start_fingerprint: StartFingerprint
    verify: VerifySpec = Field(default_factory=VerifySpec)


class CodingTask(Task):
    env_kind: ClassVar[str] = "coding"

    def __init__(self, spec: TaskSpec, folder: Path, files: dict[str, bytes], hidden: dict[str, bytes],
                 golden: str, wrong: list[str]) -> None:
        self.spec = spec
        self.folder = folder
        self.id = spec.id
        self.description = spec.description
        self.start_fingerprint = spec.start_fingerprint
        self.files = files
        self.hidden = hidden
        self.golden_patch = golden
        self.wrong_patches = wrong
        self.verify_timeout = spec.verify.timeout_s
        # "judge": the hidden tests run in the trusted judge; "in-process": declared by the task
        self.trust = spec.verify.verifier
        self._read_targets = sorted(p for p in files if p.endswith(".py"))[:2] or sorted(files)[:2]
        # read once, here: the harness parses no source in its worker threads (CPython 3.11's ast
        # is not thread-safe: "AST constructor recursion depth mismatch" under two workers)
        self.test_imports: frozenset[str] = hidden_test_imports(hidden)
        self.hidden_style = "pytest" if test_style.is_pytest_style(_trees(hidden)) else "unittest"

    def oracle_plan(self) -> list[ActionSpec]:
        reads = [ActionSpec("shell", {"command": f"cat {p}"}) for p in self._read_targets]
        return [
            ActionSpec("shell", {"command": "ls -R"}),
            *reads,
            ActionSpec("patch", {"patch": self.golden_patch}),
            ActionSpec(SUBMIT),
        ]

    def wrong_plan(self, choice: int) -> list[ActionSpec]:
        patch = self.wrong_patches[choice % len(self.wrong_patches)]
        return [ActionSpec("shell", {"command": "ls -R"}), ActionSpec("patch", {"patch": patch}),
                ActionSpec(SUBMIT)]

    @property
    def wrong_choices(self) -> int:
        return len(self.wrong_patches)

    def branch_prefix(self, k: int) -> list[ActionSpec]:
        """Exploring actions interleaved with notes the agent writes: every step changes the state."""
        return [self.explore_action(i // 2) if i % 2 else
                ActionSpec("write", {"path": f"notes/step-{i}.md", "content": f"step {i}: looked around\n"})
                for i in range(k)]

    def explore_action(self, i: int) -> ActionSpec:
        names = sorted(self.files)
        target = names[i % len(names)]
        commands = (
            f"cat {target}",
            "ls -la",
            f"grep -n 'def ' {target} || true",
            f"wc -l {target}",
            "find . -name '*.py' | sort | head -50",
            "python3 -c 'import sys; print(sys.version)'",
        )
        return ActionSpec("shell", {"command": commands[i % len(commands)]})


def _skipped(rel: str) -> bool:
    return bool(_SKIP_PARTS & set(rel.split("/"))) or rel.endswith(".pyc")


def _read_tree(root: Path) -> dict[str, bytes]:
    """The project files under ``root`` (``suite_folders.read_tree``: nothing pointing outside ``root``)."""
    return read_tree(root, root, _skipped)


def project_files(suite: Path, spec_file: Path, project: object) -> dict[str, bytes]:
    """The files of the project a task.toml names: a folder directly under ``<suite>/projects``."""
    where = f"{spec_file}: field 'project'"
    if not isinstance(project, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", project):
        raise UsageError(f"{where}: {project!r} is not a folder name (letters, digits, _ . -); name a folder "
                         f"under {suite / 'projects'}")
    folder = inside(suite / "projects", project, where)
    if not folder.is_dir():
        raise UsageError(f"{where}: no folder {folder}")
    return _read_tree(folder)


def task_text(folder: Path, spec_file: Path, rel: object, fld: str) -> str:
    """The UTF-8 text of the file a task.toml field names, inside the task's folder."""
    p = inside(folder, rel, f"{spec_file}: field {fld!r}")
    if not os.path.lexists(p):
        raise UsageError(f"{spec_file}: field {fld!r}: file {rel!r} does not exist in {folder}")
    return read_text(p, folder)


PATCH_PREFIX = "drumsbench-patch-"


def _sweep_patch_folders() -> None:
    """Remove the patch folders of processes that died before removing theirs (a harness killed
    with SIGKILL while loading its suite): their names carry the pid."""
    base = Path(tempfile.gettempdir())
    for folder in base.glob(f"{PATCH_PREFIX}*-*"):
        pid = folder.name[len(PATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def apply_patch_to_files(files: dict[str, bytes], patch: str, where: str) -> dict[str, bytes]:
    """``git apply`` ``patch`` to an in-memory tree; ``UsageError`` naming ``where`` if it does not apply."""
    _sweep_patch_folders()
    with tempfile.TemporaryDirectory(prefix=f"{PATCH_PREFIX}{os.getpid()}-") as tmp:
        root = Path(tmp) / "t"
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        root.mkdir(exist_ok=True)
        # git never looks for a repository above the folder (a patch applies to the project only)
        proc = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch.encode(),
                              capture_output=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": tmp})
        if proc.returncode != 0:
            why = " ".join(proc.stderr.decode(errors="replace").split())[:200]
            raise UsageError(f"{where}: does not apply to the project ({why}); regenerate it with git diff")
        links = [p for p in root.rglob("*") if p.is_symlink()]
        if links:
            raise UsageError(f"{where}: creates the symlink {links[0].relative_to(root).as_posix()!r}; a task's "
                             "start state holds files only, remove it from the patch")
        return _read_tree(root)


_AST_LOCK = threading.Lock()


def _parse(source: bytes, name: str) -> ast.Module:
    """``ast.parse`` one at a time in this process: CPython 3.11's parser state is not thread-safe
    ("SystemError: AST constructor recursion depth mismatch" when two worker threads load tasks)."""
    with _AST_LOCK:
        return ast.parse(source, filename=name)


def hidden_test_imports(hidden: dict[str, bytes]) -> frozenset[str]:
    """Top-level modules the hidden test files import themselves, read by syntax on the host from the
    task's own bytes: the only names a ``missing_dependency`` verdict may give (the staged copies in
    the sandbox are within the code under test's reach by the time it runs). A file that does not
    parse imports nothing here (the verifier reports it)."""
    found: set[str] = set()
    for tree in _trees(hidden).values():
        found |= test_style.top_imports(tree)
    return frozenset(found)


def _trees(hidden: dict[str, bytes]) -> dict[str, ast.Module]:
    """The hidden files' syntax trees (those that parse: the verifier reports the others)."""
    trees = {}
    for name, source in hidden.items():
        try:
            trees[name] = _parse(source, name)
        except (SyntaxError, ValueError):
            continue
    return trees


def _defines_tests(name: str, source: bytes) -> bool:
    """Does one hidden file define a test (``test_style``: a unittest method or a pytest test)?"""
    trees = _trees({name: source})
    return bool(trees) and bool(test_style.expected_tests(trees)[1])


def _field(spec_file: Path, e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(file)"
    return f"{spec_file}: field {loc!r}: {err['msg']}"


def load_task(folder: Path, suite: Path) -> CodingTask:
    """One task folder of ``suite`` (module contract): every file it names is read inside the task
    folder, the project inside ``<suite>/projects/<project>``; ``UsageError`` on any problem."""
    spec_file = folder / "task.toml"
    raw = read_toml(spec_file, folder)
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(_field(spec_file, e) + "; see docs/tasks.md") from None

    def text(rel: str, fld: str) -> str:
        return task_text(folder, spec_file, rel, fld)

    files = apply_patch_to_files(project_files(suite, spec_file, spec.project), text(spec.bug_patch, "bug_patch"),
                                 f"{folder / spec.bug_patch}")
    digest = files_digest(files)
    if digest != spec.start_fingerprint:
        raise UsageError(f"{spec_file}: field 'start_fingerprint' is {spec.start_fingerprint} but the start state "
                         f"digests to {digest}; update it (drumsbench tasks fingerprint {suite})")
    hidden: dict[str, bytes] = {}
    for rel in spec.hidden_tests:
        name = Path(rel).name
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.py", name):
            raise UsageError(f"{spec_file}: field 'hidden_tests': {rel!r} is not a Python module file name "
                             "(letters, digits, _ and .py); rename it")
        if name in hidden:
            raise UsageError(f"{spec_file}: field 'hidden_tests': two files are named {name!r}; "
                             "hidden test files are copied into one folder, give them distinct names")
        hidden[name] = text(rel, "hidden_tests").encode()
        if name != test_style.CONFTEST and not _defines_tests(name, hidden[name]):
            raise UsageError(f"{spec_file}: field 'hidden_tests': {rel!r} defines no test method or function "
                             "(test_* methods of a class, or pytest's test_* functions); a verifier that checks "
                             "nothing is refused")
    if spec.verify.verifier == "in-process" and test_style.is_pytest_style(_trees(hidden)):
        raise UsageError(f"{spec_file}: field 'verify.verifier': pytest-style hidden tests run in the trusted "
                         "judge only; remove verifier = \"in-process\" (or write the tests as unittest classes)")
    return CodingTask(spec, folder, files, hidden, text(spec.golden_patch, "golden_patch"),
                      [text(w, "wrong_patches") for w in spec.wrong_patches])


@functools.lru_cache(maxsize=8)
def _load_suite_cached(resolved: str) -> tuple[CodingTask, ...]:
    suite = Path(resolved)
    return load_folders(suite, lambda f: load_task(f, suite), "docs/tasks.md")


def load_suite(name_or_path: str) -> list[CodingTask]:
    return list(_load_suite_cached(str(suite_dir(name_or_path).resolve())))


def compute_fingerprints(name_or_path: str) -> dict[str, str]:
    """Start fingerprint of every task folder of a suite, without checking the stored values."""
    suite = suite_dir(name_or_path)
    out = {}
    for folder in task_folders(suite, "docs/tasks.md"):
        spec_file = folder / "task.toml"
        raw = read_toml(spec_file, folder)
        bug_rel = raw.get("bug_patch", "bug.patch")
        bug = task_text(folder, spec_file, bug_rel, "bug_patch")
        out[str(raw.get("id", folder.name))] = files_digest(
            apply_patch_to_files(project_files(suite, spec_file, raw.get("project")), bug, f"{folder / str(bug_rel)}"))
    return out


