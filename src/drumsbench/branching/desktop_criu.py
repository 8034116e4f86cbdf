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
- Shipping (``Shippable``, ``branch --executor ray``): ``prepare_to_ship`` checkpoints without
  restoring ahead; ``pack`` is a tar of the images, the frozen copy and what a restore needs
  besides (the parent's path and display, the actions so far, the instance's settings);
  ``unpack`` writes it into a folder of the node's own process substrate (its sandbox folders,
  removed with them) and fills the pool there. The parent's path must exist on the node as a
  mount point: on another host ``unpack`` creates it (empty).
- Clean-up: the restored holder is pid 1 of its pid namespace; the continuation's sandbox kills its
  process group on destroy (the restored processes keep the parent's sandbox label, which CRIU
  restores with their memory, and the run label, so ``drumsbench gc`` finds them). The images and
  the frozen copy live in the run's sandbox folder (removed by ``close``, the substrate and gc).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

from drumsbench.branching.methods import ForkCost, ForkMethod, Requirements, Shippable
from drumsbench.core import criu
from drumsbench.core import criu_binary as criu_install
from drumsbench.core.errors import UsageError
from drumsbench.envs.base import ActionSpec, Environment
from drumsbench.envs.desktop import restore
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate, sandbox_root

_TAR = ["tar", "--format=posix", "--xattrs", "--numeric-owner"]
_META = "meta.json"


class CriuFork(ForkMethod, Shippable):
    """Continuations restored from one checkpoint; ``POOL`` of them are restored ahead of demand
    (``prepare`` fills the pool, a background thread refills it after each ``fork``), so a
    ``fork`` that finds one ready only hands it over. ``timings`` has where each continuation's
    time went (seconds: provision, copy, restore, adopt; ``wait`` for the caller: 0 from the pool).
    ``fork_cost``: creation is the sum of those phases, wherever they ran (in the pool's thread
    ahead of demand, or while the caller waited); the caller's wait is the hand-over."""

    name = "criu"
    POOL = 3  # continuations kept restored ahead of demand (>= ``BranchConfig.growth_forks``)
    FILL_TIMEOUT_S = 300.0
    folder: Path | None = None  # the checkpoint's folder, once ``prepare`` made it

    @classmethod
    def requires(cls) -> Requirements:
        from drumsbench.envs.desktop.env import DesktopEnv

        return Requirements(sandbox=(ProcessSandbox,), environment=(DesktopEnv,))

    @classmethod
    def machine_problem(cls) -> str | None:
        return criu_install.missing()

    @classmethod
    def configure_parent(cls, env: Environment) -> None:
        """The parent must be started checkpointable (before its reset)."""
        from drumsbench.envs.desktop.env import DesktopEnv

        if isinstance(env, DesktopEnv):
            env.settings = dataclasses.replace(env.settings, checkpointable=True)

    def prepare(self, parent: Slot) -> None:
        self._checkpoint(parent)
        self._start_pool()

    def prepare_to_ship(self, parent: Slot) -> None:
        self._checkpoint(parent)  # the continuations are restored on the nodes, none here

    def _checkpoint(self, parent: Slot) -> None:
        from drumsbench.envs.desktop.env import DesktopEnv

        missing = criu_install.missing()
        if missing:
            raise UsageError(f"--methods {self.name}: {missing}")
        env = parent.env
        if not isinstance(env, DesktopEnv) or env.inst is None or not env.settings.checkpointable:
            raise UsageError(f"--methods {self.name}: only for the desktop environment started checkpointable")
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
        self.document_uid = env.document_uid
        self.settings = env.settings
        self.checkpoint_phases: dict[str, float] = {}
        self.checkpoint_s = criu.checkpoint(inst.holder_pid, self.images, {str(root): str(self.frozen)},
                                            phases=self.checkpoint_phases)
        self._init_pool()

    def pack(self) -> bytes:
        assert self.folder is not None, "pack after prepare_to_ship"
        meta = {"parent_root": self.parent_root, "display": self.display,
                "history": [[a.kind, a.payload] for a in self.history],
                "settings": dataclasses.asdict(self.settings), "checkpoint_s": self.checkpoint_s,
                "document_uid": self.document_uid}
        (self.folder / _META).write_text(json.dumps(meta))
        proc = subprocess.run([*_TAR, "-C", str(self.folder), "-c", _META, "images", "frozen"],
                              capture_output=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"criu: cannot pack {self.folder}: {proc.stderr.decode(errors='replace')[-300:]}")
        return proc.stdout

    def unpack(self, data: bytes) -> None:
        from drumsbench.envs.desktop.instance import Settings
        from drumsbench.envs.desktop.task import DesktopTask

        missing = criu_install.missing()
        if missing:
            raise UsageError(f"--methods {self.name}: {missing}")
        if not isinstance(self.substrate, ProcessSubstrate) or not isinstance(self.task, DesktopTask):
            raise UsageError(f"--methods {self.name}: only the desktop on the process substrate restores a checkpoint")
        self.folder = sandbox_root(self.substrate.state_dir, self.substrate.run_id) / f"criu-{uuid.uuid4().hex[:8]}"
        self.folder.mkdir(parents=True)
        proc = subprocess.run([*_TAR, "-C", str(self.folder), "-x", "--same-permissions"], input=data,
                              capture_output=True, timeout=600)
        if proc.returncode != 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise RuntimeError(f"criu: cannot unpack into {self.folder}: {proc.stderr.decode(errors='replace')[-300:]}")
        meta = json.loads((self.folder / _META).read_text())
        self.images, self.frozen = self.folder / "images", self.folder / "frozen"
        self.parent_root, self.display = str(meta["parent_root"]), int(meta["display"])
        self.parent_task = self.task
        self.history = [ActionSpec(kind, payload) for kind, payload in meta["history"]]
        self.document_uid = meta.get("document_uid")
        self.settings = Settings(**meta["settings"])
        self.checkpoint_s, self.checkpoint_phases = float(meta["checkpoint_s"]), {}
        Path(self.parent_root).mkdir(parents=True, exist_ok=True)  # the restore's mount point
        self._init_pool()
        self._start_pool()

    def _init_pool(self) -> None:
        """The pool's state, empty (``close`` needs it once a checkpoint folder exists)."""
        self.timings: list[dict[str, float]] = []
        self.fill_errors: list[str] = []
        self._pool: list[tuple[Slot, dict[str, float]]] = []  # restored ahead, with their timings
        self._handed: dict[int, dict[str, float]] = {}  # id(slot) -> its timings, until ``fork_cost``
        self._pending = 0
        self._closing = False
        self._cond = threading.Condition()
        self._filler: threading.Thread | None = None

    def _start_pool(self) -> None:
        """Restore ``POOL`` continuations ahead of demand (a background thread) and wait for them."""
        assert self.folder is not None
        if self.POOL > 0:
            self._filler = threading.Thread(target=self._fill, name=f"criu-pool-{self.folder.name}", daemon=True)
            self._filler.start()
            deadline = time.monotonic() + self.FILL_TIMEOUT_S
            with self._cond:
                while len(self._pool) < self.POOL and not self.fill_errors and time.monotonic() < deadline:
                    self._cond.wait(timeout=1.0)

    def _fill(self) -> None:
        """Keep ``POOL`` continuations restored (one restore at a time: the host has few cores)."""
        while True:
            with self._cond:
                while not self._closing and len(self._pool) + self._pending >= self.POOL:
                    self._cond.wait()
                if self._closing:
                    return
                self._pending += 1
            try:
                slot, phases = self._restore_one()
            except Exception as e:  # a failed restore ahead of demand: the next fork restores itself
                with self._cond:
                    self._pending -= 1
                    self.fill_errors.append(f"pool: {type(e).__name__}: {e}"[:300])
                    self._cond.notify_all()
                    if len(self.fill_errors) >= 3:
                        return
                continue
            with self._cond:
                self._pending -= 1
                if self._closing:
                    slot.destroy()
                    return
                self._pool.append((slot, phases))
                self._cond.notify_all()

    def _restore_one(self) -> tuple[Slot, dict[str, float]]:
        from drumsbench.envs.desktop.env import DesktopEnv
        from drumsbench.envs.desktop.instance import DesktopInstance

        t0 = time.monotonic()
        slot = Slot(self.substrate, self.make_env())
        slot.provision()
        try:
            box = slot.sandbox
            env = slot.env
            assert isinstance(box, ProcessSandbox) and isinstance(env, DesktopEnv)
            env.settings = self.settings
            root = Path(box.host_root)
            t1 = time.monotonic()
            restore.copy_frozen(self.frozen, root, None, None)
            t2 = time.monotonic()
            cpu: dict[str, float] = {}
            pid = restore.restore_tree(self.images, self.parent_root, root, box.id, cpu)
            t3 = time.monotonic()
            box.adopt_group(pid)  # destroy kills the restored tree
            inst = DesktopInstance.adopt_restored(box, self.settings, pid, self.display, self.parent_root)
            assert self.parent_task is not None
            env.adopt(self.parent_task, inst, self.history, self.document_uid)
        except BaseException:
            slot.destroy()
            raise
        t4 = time.monotonic()
        return slot, {"provision_s": t1 - t0, "copy_s": t2 - t1, "restore_s": t3 - t2, "adopt_s": t4 - t3, **cpu}

    def fork(self, parent_generation: int) -> Slot:
        t0 = time.monotonic()
        with self._cond:
            ready = self._pool.pop(0) if self._pool else None
            self._cond.notify_all()
        if ready is not None:
            slot, phases = ready[0], {**ready[1], "pooled": 1.0}
        else:
            slot, phases = self._restore_one()
            phases["pooled"] = 0.0
        slot.env.generation = parent_generation + 1
        phases["wait_s"] = time.monotonic() - t0
        with self._cond:
            self.timings.append(phases)
            self._handed[id(slot)] = phases
        return slot

    MAKING = ("provision_s", "copy_s", "restore_s", "adopt_s")  # the phases that make a continuation

    def fork_cost(self, slot: Slot, wall_s: float) -> ForkCost:
        with self._cond:
            phases = self._handed.pop(id(slot), None)
        if phases is None:  # not one of this method's hand-overs: what the caller waited
            return super().fork_cost(slot, wall_s)
        return ForkCost(creation_s=sum(phases.get(k, 0.0) for k in self.MAKING), handover_s=wall_s,
                        ahead=phases.get("pooled") == 1.0, phases=dict(phases))

    def close(self) -> None:
        if self.folder is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._filler is not None:
            self._filler.join(timeout=self.FILL_TIMEOUT_S)
        with self._cond:
            pooled, self._pool = self._pool, []
        for slot, _phases in pooled:
            slot.destroy()
        shutil.rmtree(self.folder, ignore_errors=True)


class ColdCriuFork(CriuFork):
    """``criu`` without the pool: every fork provisions, copies and restores while the caller waits."""

    name = "criu-cold"
    POOL = 0


def available() -> str | None:
    return criu_install.missing()

