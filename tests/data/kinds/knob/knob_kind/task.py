"""A knob task: a start position and a mark; its task.toml is ``id``, ``start``, ``mark``,
``description`` and ``start_fingerprint``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.suite_folders import StartFingerprint, TaskId, load_folders, read_toml, suite_dir

DOC = "tests/data/kinds/knob/knob_kind/__init__.py"
MAX_TURN = 10


class KnobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: TaskId
    description: str
    start: int
    mark: int
    start_fingerprint: StartFingerprint


def start_digest(position: int) -> str:
    """The start fingerprint: what the knob file holds at the start."""
    return "sha256:" + hashlib.sha256(f"knob={position}\n".encode()).hexdigest()


def turns(clicks: int) -> list[ActionSpec]:
    """``clicks`` as turns of at most ``MAX_TURN`` each."""
    out = []
    while clicks:
        step = max(-MAX_TURN, min(MAX_TURN, clicks))
        out.append(ActionSpec("turn", {"clicks": step}))
        clicks -= step
    return out


class KnobTask(Task):
    env_kind: ClassVar[str] = "knob"
    verify_timeout = 10.0

    def __init__(self, spec: KnobSpec) -> None:
        self.id, self.description = spec.id, spec.description
        self.start, self.mark = spec.start, spec.mark
        self.start_fingerprint = spec.start_fingerprint

    def oracle_plan(self) -> list[ActionSpec]:
        return [*turns(self.mark - self.start), ActionSpec(SUBMIT)]

    def wrong_plan(self, choice: int) -> list[ActionSpec]:
        return [*turns(self.mark - self.start + 1), ActionSpec(SUBMIT)]

    def explore_action(self, i: int) -> ActionSpec:
        return ActionSpec("turn", {"clicks": 0})


def _load_one(folder: Path) -> KnobTask:
    raw = read_toml(folder / "task.toml", folder)
    try:
        return KnobTask(KnobSpec.model_validate(raw))
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{folder}/task.toml: field {field!r}: {first['msg']}; see {DOC}") from None


def load_suite(name_or_path: str) -> list[KnobTask]:
    return list(load_folders(suite_dir(name_or_path), _load_one, DOC))


def compute_fingerprints(name_or_path: str) -> dict[str, str]:
    out = {}
    for spec_file in sorted(suite_dir(name_or_path).glob("*/task.toml")):
        raw = read_toml(spec_file, spec_file.parent)
        out[str(raw.get("id", spec_file.parent.name))] = start_digest(int(raw["start"]))
    return out
