"""A Harbor task as the ``harbor`` environment kind runs it (``HarborTask``), made from its spec.

Contract of ``load_suite(path)``: the tasks of ``load_specs(path)`` (one line per refusal, exit 2),
each with what a run needs read once: its start image's recipe (``recipe.agent_recipe``) and its
verifier's (separate mode's own image, else the start image's), the oracle's files
(``solution/``), the tests (``tests/``, copied into the verifier's sandbox at ``/tests``), the
working folder (the Dockerfile's ``WORKDIR`` or ``[environment] workdir``: required, and never a
system folder) and the paths carried from the agent's sandbox into the verifier's (the working
folder, plus what ``[metadata] drumsbench_carry`` declares: absolute paths outside the system's
own and the verifier's folders). ``start_fingerprint`` names the start image's recipe: the
environment reports the same name only for a sandbox of that image whose working folder is the
image's, with the sandbox's own folders empty.

Plans: the oracle writes ``solution/`` to ``/solution`` and runs ``bash /solution/solve.sh`` in the
working folder (Harbor's oracle agent); exploring
lists and reads the working folder; the wrong plan explores once and submits (the null policy
submits at once: Harbor's nop).
"""

from __future__ import annotations

import functools
import posixpath
from pathlib import Path
from typing import ClassVar

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.harbor.recipe import agent_recipe, verifier_recipe
from drumsbench.envs.harbor.spec import DOC, HarborTaskSpec, load_specs
from drumsbench.envs.suite_folders import read_tree
from drumsbench.substrates.base import ImageRecipe

# Folders a task's working folder or a carried path may not be (or be inside): the system's own, the
# verifier's (Harbor's /logs and /tests), the oracle's, DrumsBench's sandbox folders.
SYSTEM = ("/bin", "/boot", "/dev", "/etc/alternatives", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
          "/sbin", "/sys", "/usr", "/var/lib", "/logs", "/tests", "/solution", "/sandbox")
CARRY_KEY = "drumsbench_carry"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def checked_path(path: object, where: str) -> str:
    """``path`` normalised, or ``UsageError`` naming ``where``: absolute, not ``/``, and neither a
    system folder (``SYSTEM``) nor inside one, nor holding one."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise UsageError(f"{where}: {path!r} is not an absolute path; give one like /app (see {DOC})")
    norm = posixpath.normpath(path)
    if norm == "/" or any(_inside(norm, s) or _inside(s, norm) for s in SYSTEM):
        raise UsageError(f"{where}: {norm} is or holds a system or verifier folder; give the task's own "
                         f"folder, e.g. /app (see {DOC})")
    return norm


class HarborTask(Task):
    """One Harbor task (module contract)."""

    env_kind: ClassVar[str] = "harbor"

    def __init__(self, spec: HarborTaskSpec) -> None:
        self.spec = spec
        self.id = spec.id
        self.description = spec.instruction
        self.verify_timeout = spec.verifier_timeout_s
        self.agent_timeout = spec.agent_timeout_s
        toml = spec.folder / "task.toml"
        if not spec.workdir:
            raise UsageError(f"{spec.folder}/environment/Dockerfile: no WORKDIR; give the task's working folder "
                             f"(WORKDIR /app, or [environment] workdir in task.toml; see {DOC})")
        self.workdir = checked_path(spec.workdir, f"{spec.folder}: the working folder")
        extra = spec.metadata.get(CARRY_KEY, [])
        if not isinstance(extra, list):
            raise UsageError(f"{toml}: [metadata] {CARRY_KEY}: give a list of absolute paths")
        self.carry = (self.workdir, *sorted({checked_path(p, f"{toml}: [metadata] {CARRY_KEY}") for p in extra}))
        self.solution = read_tree(spec.folder / "solution", spec.folder)
        self.tests = read_tree(spec.folder / "tests", spec.folder)
        self.start_fingerprint = f"image:{self.start_recipe.digest()}"

    @functools.cached_property
    def start_recipe(self) -> ImageRecipe:
        return agent_recipe(self.spec)

    @functools.cached_property
    def verifier_recipe(self) -> ImageRecipe:
        """The image the verifier's fresh sandbox is made of: separate mode's own, else the start's."""
        return verifier_recipe(self.spec) or self.start_recipe

    @property
    def separate(self) -> bool:
        return self.spec.verifier_mode == "separate"

    def oracle_plan(self) -> list[ActionSpec]:
        writes = [ActionSpec("write", {"path": f"/solution/{rel}", "content": data.decode(errors="replace")})
                  for rel, data in sorted(self.solution.items())]
        return [*writes, ActionSpec("shell", {"command": "bash /solution/solve.sh"}), ActionSpec(SUBMIT)]

    def wrong_plan(self, choice: int) -> list[ActionSpec]:
        """A look around, then submit: Harbor's nop with one step (the null policy is the nop itself)."""
        return [self.explore_action(choice), ActionSpec(SUBMIT)]

    def explore_action(self, i: int) -> ActionSpec:
        commands = ("ls -la", "find . -maxdepth 2 -type f | head -50", "cat /etc/os-release")
        return ActionSpec("shell", {"command": commands[i % len(commands)]})


@functools.lru_cache(maxsize=16)
def _load_cached(resolved: str) -> tuple[HarborTask, ...]:
    return tuple(HarborTask(s) for s in load_specs(resolved))


def load_suite(path: str) -> list[HarborTask]:
    """The tasks of ``path`` (module contract)."""
    return list(_load_cached(str(Path(path).resolve())))


def compute_fingerprints(path: str) -> dict[str, str]:
    """Each task's start fingerprint (the name of its start image's recipe)."""
    return {t.id: t.start_fingerprint for t in load_suite(path)}
