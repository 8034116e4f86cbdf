"""Desktop tasks: load and validate a desktop task suite (format: docs/desktop.md).

A suite folder holds ``suite.toml`` (``env = "desktop"``) and one folder per task with
``task.toml`` and ``check.py``. ``task.toml`` gives the application (writer / calc), the start
document's body as ODF XML, the oracle's action list, one or more wrong plans and the start
fingerprint; ``check.py`` defines ``check(doc, ctx) -> (passed, why)``, run inside the instance by
the verifier runner. ``load_suite(name_or_path)`` returns the tasks sorted by id, each with its
start document built and its start fingerprint checked; any problem raises ``UsageError`` naming
the file, the field and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.desktop import odf
from drumsbench.envs.suite_folders import StartFingerprint, TaskId, load_folders, suite_dir

ACTION_KINDS = {"key", "type", "click", "double_click", "drag", "scroll", "move", "wait", "shell"}
APP_TITLES = {"writer": "LibreOffice Writer", "calc": "LibreOffice Calc"}
SCREEN = (1280, 800)


class ActionModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {v!r}; choose from {', '.join(sorted(ACTION_KINDS))}")
        return v

    def spec(self) -> ActionSpec:
        return ActionSpec(self.kind, dict(self.model_extra or {}))


class DesktopTaskSpec(BaseModel):
    """The fields of a desktop task.toml."""

    model_config = ConfigDict(extra="forbid")
    id: TaskId
    app: Literal["writer", "calc"]
    description: str = Field(min_length=1)
    document: str = ""
    body: str
    start_fingerprint: StartFingerprint
    oracle: list[ActionModel] = Field(min_length=1)
    wrong: list[list[ActionModel]] = Field(min_length=1)
    verify_timeout_s: float = Field(30.0, gt=0)


def lock_name(document: str) -> str:
    """The name LibreOffice gives the lock file of ``document`` (beside it)."""
    return f".~lock.{document}#"


def expected_title(app: str, document: str) -> str:
    return f"{document} - {APP_TITLES[app]}"


def state_digest(work: dict[str, str], title: str, profile_lock: str, screen: tuple[int, int]) -> str:
    """The start fingerprint: work folder (name -> sha256 or lock state), window title, profile lock, screen."""
    doc = {"work": dict(sorted(work.items())), "title": title, "profile_lock": profile_lock,
           "screen": f"{screen[0]}x{screen[1]}"}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def start_digest(app: str, document: str, data: bytes) -> str:
    """What the fingerprint of a correct start is: the document as written, its lock held by this
    instance, the document's window focused, the profile lock this instance's."""
    work = {document: hashlib.sha256(data).hexdigest(), lock_name(document): "own"}
    return state_digest(work, expected_title(app, document), "own", SCREEN)


class DesktopTask(Task):
    env_kind: ClassVar[str] = "desktop"

    def __init__(self, spec: DesktopTaskSpec, folder: Path, document_bytes: bytes, check: bytes) -> None:
        self.spec = spec
        self.folder = folder
        self.id = spec.id
        self.app = spec.app
        self.description = spec.description
        self.start_fingerprint = spec.start_fingerprint
        self.document = spec.document or f"start{odf.extension(spec.app)}"
        self.document_bytes = document_bytes
        self.check = check
        self.verify_timeout = spec.verify_timeout_s
        self.title = expected_title(spec.app, self.document)

    def oracle_plan(self) -> list[ActionSpec]:
        return [a.spec() for a in self.spec.oracle] + [ActionSpec(SUBMIT)]

    def wrong_plan(self, choice: int) -> list[ActionSpec]:
        plan = self.spec.wrong[choice % len(self.spec.wrong)]
        return [a.spec() for a in plan] + [ActionSpec(SUBMIT)]

    @property
    def wrong_choices(self) -> int:
        return len(self.spec.wrong)

    def branch_prefix(self, k: int) -> list[ActionSpec]:
        """The oracle's first k actions (then harmless looks, if k is longer): a prepared state
        halfway through real work — text typed, a dialog open, a selection made."""
        oracle = [a for a in self.oracle_plan() if a.kind != SUBMIT]
        return oracle[:k] + [self.explore_action(i) for i in range(max(0, k - len(oracle)))]

    def continuation(self, k: int, solve: bool, choice: int = 0) -> list[ActionSpec]:
        """The prefix was the oracle's first k actions: solving goes on from the k-th."""
        if solve:
            return self.oracle_plan()[min(k, len(self.oracle_plan()) - 1):]
        return self.wrong_plan(choice)

    def explore_action(self, i: int) -> ActionSpec:
        """Harmless looks around: hover over the document and toolbars, short waits."""
        w, h = SCREEN
        points = [(w // 2, h // 2), (w // 3, h // 4), (2 * w // 3, 2 * h // 3), (w // 4, 3 * h // 4)]
        if i % 3 == 2:
            return ActionSpec("wait", {"seconds": 0.05})
        x, y = points[i % len(points)]
        return ActionSpec("move", {"x": x, "y": y})

    def verify_files(self, work: str, app_exit_file: str = "", document_uid: str | None = None) -> dict[str, bytes]:
        """The verifier's folder: the task's ``check.py`` and ``task.json`` (what the runner reads:
        the document's name and place, LibreOffice's exit status file, the RuntimeUID of the
        document the attempt began with when known)."""
        meta = {"task": self.id, "app": self.app, "document": self.document, "work": work,
                "app_exit_file": app_exit_file, "document_uid": document_uid}
        return {"check.py": self.check, "task.json": json.dumps(meta).encode()}


def _field(spec_file: Path, e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(file)"
    return f"{spec_file}: field {loc!r}: {err['msg']}"


def _raw(spec_file: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(spec_file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{spec_file}: not valid TOML ({e}); fix the syntax") from None


def load_task(folder: Path) -> DesktopTask:
    spec_file = folder / "task.toml"
    try:
        spec = DesktopTaskSpec.model_validate(_raw(spec_file))
    except ValidationError as e:
        raise UsageError(_field(spec_file, e) + "; see docs/desktop.md") from None
    check = folder / "check.py"
    if not check.is_file():
        raise UsageError(f"{folder}: no check.py; a desktop task needs check(doc, ctx) -> (passed, why)")
    data = odf.build(spec.app, spec.body)
    document = spec.document or f"start{odf.extension(spec.app)}"
    digest = start_digest(spec.app, document, data)
    if digest != spec.start_fingerprint:
        raise UsageError(f"{spec_file}: field 'start_fingerprint' is {spec.start_fingerprint} but the start state "
                         f"digests to {digest}; update it "
                         f"(python -m drumsbench.envs.desktop.task --write {folder.parent})")
    return DesktopTask(spec, folder, data, check.read_bytes())


@functools.lru_cache(maxsize=8)
def _load_suite_cached(resolved: str) -> tuple[DesktopTask, ...]:
    suite = Path(resolved)
    return load_folders(suite, load_task, "docs/desktop.md")


def load_suite(name_or_path: str) -> list[DesktopTask]:
    return list(_load_suite_cached(str(suite_dir(name_or_path).resolve())))


def compute_fingerprints(name_or_path: str) -> dict[str, str]:
    """Start fingerprint of every task folder of a suite, without checking the stored values."""
    out = {}
    for spec_file in sorted(suite_dir(name_or_path).glob("*/task.toml")):
        raw = _raw(spec_file)
        app = str(raw.get("app", "writer"))
        document = str(raw.get("document") or f"start{odf.extension(app)}")
        out[str(raw.get("id", spec_file.parent.name))] = start_digest(app, document, odf.build(app, str(raw["body"])))
    return out


def write_fingerprints(name_or_path: str) -> list[str]:
    """Rewrite each task.toml's start_fingerprint to the computed value; returns the ids changed."""
    changed = []
    folder = suite_dir(name_or_path)
    for task_id, fp in compute_fingerprints(name_or_path).items():
        for spec_file in folder.glob("*/task.toml"):
            text = spec_file.read_text()
            if str(_raw(spec_file).get("id")) != task_id:
                continue
            new = re.sub(r'^start_fingerprint = "[^"]*"', f'start_fingerprint = "{fp}"', text, flags=re.M)
            if new != text:
                spec_file.write_text(new)
                changed.append(task_id)
    return changed


if __name__ == "__main__":  # python -m drumsbench.envs.desktop.task [--write] [suite]
    import sys

    argv = [a for a in sys.argv[1:] if a != "--write"]
    suite_arg = argv[0] if argv else "desktop"
    if "--write" in sys.argv[1:]:
        print("updated:", ", ".join(write_fingerprints(suite_arg)) or "nothing")
    else:
        for task_id, fp in compute_fingerprints(suite_arg).items():
            print(f"{task_id}\t{fp}")
