"""What every task suite on disk shares: one folder per task with a task.toml, unique ids, and the
spelling of a task id and of a start fingerprint (``TaskId``, ``StartFingerprint``: field types of
every kind's task.toml model)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import Task

T = TypeVar("T", bound=Task)


def _task_id(v: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", v):
        raise ValueError("must be lowercase letters, digits and dashes")
    return v


def _fingerprint(v: str) -> str:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
        raise ValueError("must look like sha256:<64 hex digits>")
    return v


TaskId = Annotated[str, AfterValidator(_task_id)]
StartFingerprint = Annotated[str, AfterValidator(_fingerprint)]


def load_folders(suite: Path, load_one: Callable[[Path], T], doc: str) -> tuple[T, ...]:
    """Load every ``*/task.toml`` folder of ``suite`` with ``load_one``; sorted by id, ids unique."""
    folders = sorted(p.parent for p in suite.glob("*/task.toml"))
    if not folders:
        raise UsageError(f"--tasks: {suite} holds no */task.toml; see {doc}")
    tasks: Sequence[T] = [load_one(f) for f in folders]
    seen: dict[str, Path] = {}
    for folder, t in zip(folders, tasks, strict=True):
        if t.id in seen:
            raise UsageError(f"{folder}/task.toml: field 'id': {t.id!r} is also used by {seen[t.id]}; "
                             "ids must be unique")
        seen[t.id] = folder
    return tuple(sorted(tasks, key=lambda t: t.id))
