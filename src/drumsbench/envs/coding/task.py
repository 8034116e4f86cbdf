"""Coding tasks: load and validate a task suite from disk (format: docs/tasks.md).

Contract: ``load_suite(name_or_path)`` returns the suite's tasks sorted by id, each with its start
state in memory and its start fingerprint checked; any problem raises ``UsageError`` naming the
file, the field and the fix. Built-in suites are folders under ``drumsbench/tasks/``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from drumsbench.core.errors import UsageError
from drumsbench.core.fingerprint import files_digest
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.suite_folders import StartFingerprint, TaskId, load_folders

BUILTIN_ROOT = Path(__file__).resolve().parents[2] / "tasks"
_SKIP_PARTS = {"__pycache__", ".git"}


class VerifySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(60.0, gt=0)


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
        self._read_targets = sorted(p for p in files if p.endswith(".py"))[:2] or sorted(files)[:2]

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


def suite_dir(name_or_path: str) -> Path:
    """The folder of a suite: a bare built-in name (``coding``, ``desktop``) is the built-in suite even when
    the working folder holds a folder of that name (an out folder called ``desktop`` must not shadow it);
    anything else is a folder path. Write ``./desktop`` for a folder of that name."""
    builtin = BUILTIN_ROOT / name_or_path
    if "/" not in name_or_path and not name_or_path.startswith(".") and builtin.is_dir():
        return builtin
    path = Path(name_or_path)
    if path.is_dir():
        return path
    names = sorted(p.name for p in BUILTIN_ROOT.iterdir() if p.is_dir()) if BUILTIN_ROOT.is_dir() else []
    raise UsageError(f"--tasks: {name_or_path!r} is neither a folder nor a built-in suite ({', '.join(names)})")


def _read_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (_SKIP_PARTS & set(p.relative_to(root).parts)) and p.suffix != ".pyc":
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


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
        proc = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch.encode(),
                              capture_output=True)
        if proc.returncode != 0:
            raise UsageError(f"{where}: does not apply to the project ({proc.stderr.decode().strip()[:200]}); "
                             "regenerate it with git diff")
        return _read_tree(root)


def _defines_tests(source: bytes) -> bool:
    """Does a test file define a test method (``class ...: def test_*``), read by syntax only?"""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test")
               for node in tree.body if isinstance(node, ast.ClassDef) for item in node.body)


def _field(spec_file: Path, e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(file)"
    return f"{spec_file}: field {loc!r}: {err['msg']}"


def load_task(folder: Path, suite: Path) -> CodingTask:
    spec_file = folder / "task.toml"
    try:
        raw = tomllib.loads(spec_file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{spec_file}: not valid TOML ({e}); fix the syntax") from None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(_field(spec_file, e) + "; see docs/tasks.md") from None

    def text(rel: str, fld: str) -> str:
        p = folder / rel
        if not p.is_file():
            raise UsageError(f"{spec_file}: field {fld!r}: file {rel!r} does not exist in {folder}")
        return p.read_text()

    project = suite / "projects" / spec.project
    if not project.is_dir():
        raise UsageError(f"{spec_file}: field 'project': no folder {project}")
    files = apply_patch_to_files(_read_tree(project), text(spec.bug_patch, "bug_patch"), f"{folder / spec.bug_patch}")
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
        if not _defines_tests(hidden[name]):
            raise UsageError(f"{spec_file}: field 'hidden_tests': {rel!r} defines no test method "
                             "(a class with methods named test_*); a verifier that checks nothing is refused")
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
    for spec_file in sorted(suite.glob("*/task.toml")):
        raw = tomllib.loads(spec_file.read_text())
        project = suite / "projects" / str(raw.get("project", ""))
        bug = (spec_file.parent / str(raw.get("bug_patch", "bug.patch"))).read_text()
        out[str(raw.get("id", spec_file.parent.name))] = files_digest(
            apply_patch_to_files(_read_tree(project), bug, str(spec_file.parent)))
    return out


