"""Task suites and environment kinds.

A suite folder may hold ``suite.toml`` with ``env = "<kind>"``; without it the suite is a coding
suite. An environment kind (``EnvKind``) names, as ``"module:attr"`` strings loaded only when used,
its environment class, its suite loader and its start-fingerprint function. Kinds are found in the
registry ``KINDS`` (built-ins plus the ``drumsbench.env_kinds`` entry-point group, the pattern of
every registry: ``drumsbench.core.plugins``); ``load(name_or_path)`` returns the kind's environment
factory with the tasks, so experiments never need to know which kind they run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from drumsbench.core.errors import UsageError
from drumsbench.core.plugins import Registry, load_spec
from drumsbench.envs.actions import ActionSet
from drumsbench.envs.base import Environment, Task
from drumsbench.envs.observations import ObservationModel
from drumsbench.envs.suite_folders import check_folder, read_toml, suite_dir, task_folders


@dataclass(frozen=True)
class EnvKind:
    """An environment kind: where its parts are (``"module:attr"``), imported on first use.

    ``environment``: the ``Environment`` subclass; ``load_suite(name_or_path) -> Sequence[Task]``;
    ``fingerprints(name_or_path) -> dict[task id, fingerprint]`` (the start states, unchecked);
    ``task_checks`` (optional): the kind's own proof about every task, run by ``drumsbench tasks
    check`` after the environment checker, ``(suite, substrates, state_dir, progress, repeat) ->
    [TaskCheck]`` (``repeat``: how many times each verification is run, to find flaky tasks)."""

    name: str
    environment: str
    load_suite: str
    fingerprints: str
    task_checks: str | None = None
    # the document a suite author of this kind reads (named in a refused folder's error)
    docs: str = "docs/adding-an-environment.md"

    def environment_class(self) -> type[Environment[Any]]:
        cls = load_spec(self.environment)
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise UsageError(f"environment kind {self.name!r}: {self.environment} is not an Environment subclass")
        return cls

    def tasks(self, name_or_path: str) -> Sequence[Task]:
        return cast(Callable[[str], Sequence[Task]], load_spec(self.load_suite))(name_or_path)

    def start_fingerprints(self, name_or_path: str) -> dict[str, str]:
        return dict(cast(Callable[[str], dict[str, str]], load_spec(self.fingerprints))(name_or_path))


CODING = EnvKind("coding", "drumsbench.envs.coding.env:CodingEnv", "drumsbench.envs.coding.task:load_suite",
                 "drumsbench.envs.coding.task:compute_fingerprints",
                 task_checks="drumsbench.experiments.taskcheck:check_coding", docs="docs/tasks.md")
HARBOR = EnvKind("harbor", "drumsbench.envs.harbor.env:HarborEnv", "drumsbench.envs.harbor.task:load_suite",
                 "drumsbench.envs.harbor.task:compute_fingerprints",
                 task_checks="drumsbench.experiments.harbor_check:check_harbor", docs="docs/harbor.md")
DESKTOP = EnvKind("desktop", "drumsbench.envs.desktop.env:DesktopEnv", "drumsbench.envs.desktop.task:load_suite",
                  "drumsbench.envs.desktop.task:compute_fingerprints", docs="docs/desktop.md")

KINDS: Registry[EnvKind] = Registry(
    "environment", "--tasks", {"coding": "drumsbench.envs.suites:CODING", "desktop": "drumsbench.envs.suites:DESKTOP",
                               "harbor": "drumsbench.envs.suites:HARBOR"},
    "drumsbench.env_kinds", check=lambda obj: isinstance(obj, EnvKind), expected="an EnvKind")



def environment_class(kind: str) -> type[Environment[Any]]:
    """The ``Environment`` subclass of the kind named ``kind`` (``UsageError`` for an unknown one)."""
    return KINDS.load(kind).environment_class()


@dataclass(frozen=True)
class Suite:
    name: str
    kind: str
    tasks: Sequence[Task]
    make_env: Callable[[], Environment[Any]]
    actions: ActionSet  # the kind's typed actions (``Environment.actions``)
    observations: type[ObservationModel]  # what its observations show (``Environment.observations``)


def split(name_or_path: str) -> tuple[str | None, str]:
    """``KIND:PATH`` (a kind named before the folder, e.g. ``harbor:examples/harbor``) as (kind, path);
    anything else as (None, itself): a built-in suite's name or a suite folder."""
    kind, sep, rest = name_or_path.partition(":")
    if sep and rest and kind in KINDS:
        return kind, rest
    return None, name_or_path


def suite_folder(name_or_path: str) -> Path:
    """The folder of a suite given as ``--tasks`` takes it (``split``)."""
    kind, path = split(name_or_path)
    if kind is not None:
        folder = Path(path)
        if not folder.is_dir():
            raise UsageError(f"--tasks {name_or_path}: {path} is not a folder; give a folder of {kind} tasks")
        return folder
    return suite_dir(path)


def suite_kind(name_or_path: str) -> str:
    named, path = split(name_or_path)
    if named is not None:
        return named
    folder = suite_dir(path)
    meta = folder / "suite.toml"
    if not meta.exists():
        return "coding"
    kind = str(read_toml(meta, folder).get("env", "coding"))
    if kind not in KINDS:
        raise UsageError(f"{meta}: field 'env': unknown environment {kind!r}; choose one of {', '.join(KINDS.names())}")
    return kind


def load(name_or_path: str) -> Suite:
    kind = KINDS.load(suite_kind(name_or_path))
    tasks = kind.tasks(split(name_or_path)[1])
    env_class = kind.environment_class()
    return Suite(name_or_path, kind.name, tasks, env_class, env_class.actions, env_class.observations)


def fingerprints(name_or_path: str) -> dict[str, str]:
    """Start fingerprint of every task of a suite of any kind, without checking the stored values."""
    kind = KINDS.load(suite_kind(name_or_path))
    # every kind's task folders pass the shared checks first (no link out, readable UTF-8 TOML); a
    # kind named before the folder may be given one task folder itself (harbor:TASK)
    folder = suite_folder(name_or_path)
    if split(name_or_path)[0] is not None and (folder / "task.toml").is_file():
        check_folder(folder, folder)
        read_toml(folder / "task.toml", folder)
    else:
        task_folders(folder, kind.docs)
    return kind.start_fingerprints(split(name_or_path)[1])
