"""Task suites by environment kind.

A suite folder may hold ``suite.toml`` with ``env = "<kind>"``; without it the suite is a coding
suite. Each kind names its environment class and its suite loader; ``load(name_or_path)`` returns
both with the tasks, so experiments never need to know which kind they run.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from drumsbench.envs.base import Environment, Task
from drumsbench.envs.coding.task import suite_dir
from drumsbench.errors import UsageError

# kind -> (environment class, loader function), as "module:attr" so optional kinds load lazily.
KINDS: dict[str, tuple[str, str]] = {
    "coding": ("drumsbench.envs.coding.env:CodingEnv", "drumsbench.envs.coding.task:load_suite"),
    "desktop": ("drumsbench.envs.desktop.env:DesktopEnv", "drumsbench.envs.desktop.task:load_suite"),
}


# kind -> the function computing a suite's start fingerprints (``drumsbench tasks fingerprint``).
FINGERPRINTS: dict[str, str] = {
    "coding": "drumsbench.envs.coding.task:compute_fingerprints",
    "desktop": "drumsbench.envs.desktop.task:compute_fingerprints",
}


def _obj(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Suite:
    name: str
    kind: str
    tasks: Sequence[Task]
    make_env: Callable[[], Environment]


def suite_kind(name_or_path: str) -> str:
    folder = suite_dir(name_or_path)
    meta = folder / "suite.toml"
    if not meta.exists():
        return "coding"
    try:
        kind = str(tomllib.loads(meta.read_text()).get("env", "coding"))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{meta}: not valid TOML ({e}); fix the syntax") from None
    if kind not in KINDS:
        raise UsageError(f"{meta}: field 'env': unknown environment {kind!r}; choose one of {', '.join(KINDS)}")
    return kind


def load(name_or_path: str) -> Suite:
    kind = suite_kind(name_or_path)
    env_spec, loader_spec = KINDS[kind]
    tasks = _obj(loader_spec)(name_or_path)
    return Suite(name_or_path, kind, tasks, _obj(env_spec))


def fingerprints(name_or_path: str) -> dict[str, str]:
    """Start fingerprint of every task of a suite of any kind, without checking the stored values."""
    return dict(_obj(FINGERPRINTS[suite_kind(name_or_path)])(name_or_path))
