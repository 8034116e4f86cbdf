"""The ``criu`` fork method for the desktop environment: live checkpoint/restore of the whole
instance (Xvfb, openbox, LibreOffice) with CRIU.

- The parent runs as a *checkpointable* instance (``Settings.checkpointable``: pid/ipc/uts/net
  namespaces, no mount namespace, a display number of its own on the host's ``/tmp/.X11-unix``).
- ``prepare``: ``criu dump --leave-stopped`` of the parent's tree; its sandbox folder is copied while
  it is stopped (files and memory of the same instant); then the parent goes on, unchanged.
- ``fork``: a fresh sandbox gets a copy of the frozen folder; CRIU restores the tree in a private
  mount namespace where that copy is bind-mounted at the parent's exact path (lock files, profile
  URLs and open files all name the same paths) and private folders over ``/tmp/.X11-unix`` and
  ``/var/lib/xkb``. The harness reaches X through ``/proc/<pid>/root/tmp/.X11-unix`` and runs its
  clients with nsenter into the restored namespaces.
- Clean-up: the restored holder is pid 1 of its pid namespace; the continuation's sandbox kills its
  process group on destroy (the restored processes keep the parent's sandbox label, which CRIU
  restores with their memory, and the run label, so ``drumsbench gc`` finds them). The images and
  the frozen copy live in the run's sandbox folder (removed by ``close``, the substrate and gc).
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from pathlib import Path

from drumsbench.branching.methods import ForkMethod
from drumsbench.core import criu
from drumsbench.core import criu_binary as criu_install
from drumsbench.core.errors import UsageError
from drumsbench.envs.base import Environment
from drumsbench.envs.desktop import restore
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.process import ProcessSandbox


class CriuFork(ForkMethod):
    name = "criu"
    folder: Path | None = None  # the checkpoint's folder, once ``prepare`` made it

    @classmethod
    def configure_parent(cls, env: Environment) -> None:
        """The parent must be started checkpointable (before its reset)."""
        from drumsbench.envs.desktop.env import DesktopEnv

        if isinstance(env, DesktopEnv):
            env.settings = dataclasses.replace(env.settings, checkpointable=True)

    def prepare(self, parent: Slot) -> None:
        from drumsbench.envs.desktop.env import DesktopEnv

        missing = criu_install.missing()
        if missing:
            raise UsageError(f"--methods criu: {missing}")
        env = parent.env
        if not isinstance(env, DesktopEnv) or env.inst is None or not env.settings.checkpointable:
            raise UsageError("--methods criu: only for the desktop environment started checkpointable")
        inst = env.inst
        box = parent.sandbox
        assert isinstance(box, ProcessSandbox) and inst.holder_pid is not None  # the desktop runs on process
        root = Path(box.host_root)
        self.folder = root.parent / f"criu-{uuid.uuid4().hex[:8]}"
        self.images = self.folder / "images"
        self.frozen = self.folder / "frozen"
        self.parent_root = str(root)
        self.display = inst.display
        self.parent_task = env.task
        self.history = list(env.history)
        self.settings = env.settings
        self.checkpoint_s = criu.checkpoint(inst.holder_pid, self.images, {str(root): str(self.frozen)})

    def fork(self, parent_generation: int) -> Slot:
        from drumsbench.envs.desktop.env import DesktopEnv
        from drumsbench.envs.desktop.instance import DesktopInstance

        slot = Slot(self.substrate, self.make_env())
        slot.provision()
        try:
            box = slot.sandbox
            env = slot.env
            assert isinstance(box, ProcessSandbox) and isinstance(env, DesktopEnv)
            env.settings = self.settings
            root = Path(box.host_root)
            restore.copy_frozen(self.frozen, root, None, None)
            pid = restore.restore_tree(self.images, self.parent_root, root, box.id)
            box.adopt_group(pid)  # destroy kills the restored tree
            inst = DesktopInstance.adopt_restored(box, self.settings, pid, self.display, self.parent_root)
            assert self.parent_task is not None
            env.adopt(self.parent_task, inst, self.history)
            env.generation = parent_generation + 1
        except BaseException:
            slot.destroy()
            raise
        return slot

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def available() -> str | None:
    return criu_install.missing()

