"""The ``podman-checkpoint`` fork method: podman's own checkpoint/restore of a whole container
(``podman container checkpoint --export`` once, ``podman container restore --import --name`` per
continuation; CRIU underneath), for the desktop environment on the ``podman`` substrate.

- The parent's instance is started *checkpointable* in a container (``Settings.checkpointable`` on
  an ``InitLaunching`` sandbox): Xvfb, openbox and LibreOffice run in the container's own
  namespaces as descendants of its init, so the engine's checkpoint, which dumps init's tree, takes
  them (a tree in namespaces of its own, or outside init's tree, would be left out: measured).
- ``prepare``: one export of the running parent (``--leave-running``: it goes on, unchanged), into
  the run's checkpoint folder (``podman.checkpoint_dir``; ``gc`` removes a dead run's).
- ``fork``: a restore under a new name is a new sandbox whose processes continue from the
  checkpoint; the continuation's environment adopts the restored instance (its holder: the child
  of the new container's init that carries the parent's sandbox label, which the restore keeps).
  Nothing about faithfulness is assumed: the branch experiment compares every dimension.
- Clean-up: ``destroy`` of a continuation removes its container (and every process in it);
  ``close`` removes the export.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from drumsbench.branching.desktop_criu import CriuFork
from drumsbench.branching.methods import ForkMethod, Requirements
from drumsbench.core import criu_binary
from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.base import HostLaunching


def _holder(init_pid: int, label: bytes, deadline_s: float = 10.0) -> int:
    """The restored holder: the child of the container's init that carries ``label``."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
        except OSError as e:
            raise SubstrateError(f"podman-checkpoint: the restored container's init ({init_pid}) is gone") from e
        for pid in children:
            try:
                if label in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    return int(pid)
            except OSError:
                continue
        if time.monotonic() > deadline:
            raise SubstrateError("podman-checkpoint: no desktop holder in the restored container")
        time.sleep(0.01)


class PodmanCheckpointFork(ForkMethod):
    """Continuations restored from one export of the parent's container (the branch experiment
    times ``prepare``, the export, and each ``fork``)."""

    name = "podman-checkpoint"
    archive: Path | None = None
    # the parent's instance must be started checkpointable (here: under the container's init)
    configure_parent = CriuFork.configure_parent
    machine_problem = CriuFork.machine_problem

    @classmethod
    def requires(cls) -> Requirements:
        from drumsbench.envs.desktop.env import DesktopEnv
        from drumsbench.substrates.containers.podman import PodmanSubstrate
        from drumsbench.substrates.containers.podman_sandbox import PodmanSandbox

        return Requirements(substrate=(PodmanSubstrate,), sandbox=(PodmanSandbox,), environment=(DesktopEnv,))

    def prepare(self, parent: Slot) -> None:
        from drumsbench.envs.desktop.env import DesktopEnv
        from drumsbench.substrates.containers.podman import PodmanSubstrate
        from drumsbench.substrates.containers.podman_cli import checkpoint_dir
        from drumsbench.substrates.containers.podman_sandbox import PodmanSandbox

        missing = criu_binary.missing()
        if missing:
            raise UsageError(f"--methods {self.name}: {missing}")
        env, box = parent.env, parent.sandbox
        if not isinstance(self.substrate, PodmanSubstrate) or not isinstance(box, PodmanSandbox):
            raise UsageError(f"--methods {self.name}: only on the podman substrate (--substrate podman)")
        from drumsbench.envs.desktop.instance import DesktopInstance

        if not isinstance(env, DesktopEnv) or not isinstance(env.inst, DesktopInstance) or not env.inst.in_init:
            raise UsageError(f"--methods {self.name}: only for the desktop environment started checkpointable")
        assert env.task is not None
        self.parent_task, self.history, self.settings = env.task, list(env.history), env.settings
        self.document_uid = env.document_uid
        self.display = env.inst.display
        self.label = f"{HostLaunching.SANDBOX_VAR}={box.id}".encode()
        archive = checkpoint_dir(self.substrate.state_dir, self.substrate.run_id) / f"{uuid.uuid4().hex[:12]}.tar.gz"
        try:
            box.checkpoint_export(archive)
        except BaseException:
            self.substrate.drop_checkpoint(archive)  # the run's folder too, when this was its only export
            raise
        self.archive = archive

    def fork(self, parent_generation: int) -> Slot:
        from drumsbench.envs.desktop.env import DesktopEnv
        from drumsbench.envs.desktop.instance import DesktopInstance
        from drumsbench.substrates.containers.podman import PodmanSubstrate

        if self.archive is None or not isinstance(self.substrate, PodmanSubstrate):
            raise UsageError(f"--methods {self.name}: fork before prepare")
        box = self.substrate.restore_import(self.archive)
        slot = Slot(self.substrate, self.make_env())
        slot.sandbox = box
        try:
            env = slot.env
            assert isinstance(env, DesktopEnv)
            env.settings = self.settings
            env.attach(box)
            holder = _holder(box.init_pid(), self.label)
            inst = DesktopInstance.adopt_restored(box, self.settings, holder, self.display, box.paths.root)
            env.adopt(self.parent_task, inst, self.history, self.document_uid)
        except BaseException:
            slot.destroy()
            raise
        slot.env.generation = parent_generation + 1
        return slot

    def close(self) -> None:
        from drumsbench.substrates.containers.podman import PodmanSubstrate

        archive, self.archive = self.archive, None
        if archive is not None and isinstance(self.substrate, PodmanSubstrate):
            self.substrate.drop_checkpoint(archive)
