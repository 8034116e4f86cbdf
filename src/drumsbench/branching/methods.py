"""Fork methods: ways to make many continuations of one prepared live state.

A method is built for one prepared parent (a ``Slot`` that took k actions), ``prepare``s once
(snapshot, checkpoint, copy), then ``fork`` makes one continuation: a new ``Slot`` with its own
sandbox, whose environment claims the prepared state. Whether the claim is true is not the
method's business: the branch experiment compares ``Environment.capture()`` dimension by
dimension, and an unfaithful continuation is invalid.

- ``replay``: a fresh sandbox, the task's reset, then the k recorded actions again;
- ``file``: the parent's work folder copied (tar through the substrate) into a fresh sandbox;
- ``snapshot``: the substrate's own snapshot/fork (overlay upper-layer freeze, container commit).

Environments with live processes add their own (the desktop environment's ``criu``).
"""

from __future__ import annotations

import io
import tarfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.plugins import Registry
from drumsbench.envs.base import Action, ActionSpec, Environment, Resumable, Task
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.base import Forking, Snapshotting, Substrate


class ForkMethod(ABC):
    name: str

    def __init__(self, substrate: Substrate, make_env: Callable[[], Environment], task: Task,
                 recorded: list[ActionSpec], step_timeout_s: float) -> None:
        self.substrate, self.make_env, self.task = substrate, make_env, task
        self.recorded, self.step_timeout_s = recorded, step_timeout_s

    @classmethod  # noqa: B027 - most methods take any parent
    def configure_parent(cls, env: Environment) -> None:
        """Called on the parent's environment before its reset (e.g. start it checkpointable)."""

    def prepare(self, parent: Slot) -> None:  # noqa: B027 - most methods need nothing once
        """Called once, with the parent in its prepared state."""

    @abstractmethod
    def fork(self, parent_generation: int) -> Slot: ...

    def close(self) -> None:  # noqa: B027
        """Remove what ``prepare`` made (snapshots, images)."""

    def _fresh(self, generation: int) -> Slot:
        slot = Slot(self.substrate, self.make_env())
        slot.provision()
        slot.env.generation = generation
        return slot


class Replay(ForkMethod):
    name = "replay"

    def fork(self, parent_generation: int) -> Slot:
        slot = self._fresh(0)
        slot.env.reset(self.task)
        for spec in self.recorded:
            obs = slot.env.step(Action.of(spec, slot.env.generation), self.step_timeout_s)
            if obs.timed_out:
                raise SubstrateError(f"replay: step {obs.step} timed out")
        return slot


def _untar(data: bytes) -> dict[str, bytes]:
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                files[member.name.removeprefix("./")] = f.read()
    return files


class FileCopy(ForkMethod):
    name = "file"

    def prepare(self, parent: Slot) -> None:
        box = parent.sandbox
        assert box is not None
        res = box.exec(["tar", "-C", box.paths.work, "-cf", "-", "."], timeout=120, output_limit=1 << 30)
        if res.exit_code != 0 or res.truncated:
            raise SubstrateError(f"file: tar of the work folder failed (exit {res.exit_code})")
        self.files = _untar(res.stdout)

    def fork(self, parent_generation: int) -> Slot:
        slot = self._fresh(parent_generation + 1)
        box = slot.sandbox
        assert box is not None
        box.put_files(box.paths.work, self.files)
        if isinstance(slot.env, Resumable):  # environments with live applications start them on the files
            slot.env.resume(self.task)
        return slot


class NativeSnapshot(ForkMethod):
    """The substrate's own live snapshot (``Snapshotting`` sandbox, ``Forking`` substrate)."""

    name = "snapshot"
    snapshot_id: str | None = None

    def prepare(self, parent: Slot) -> None:
        box = parent.sandbox
        if not isinstance(box, Snapshotting) or not isinstance(self.substrate, Forking):
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} has no snapshot/fork")
        self.snapshot_id = box.snapshot()

    def fork(self, parent_generation: int) -> Slot:
        if not isinstance(self.substrate, Forking) or self.snapshot_id is None:
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} has no snapshot/fork")
        box = self.substrate.fork(self.snapshot_id)
        slot = Slot(self.substrate, self.make_env())
        slot.sandbox = box
        slot.env.attach(box)
        slot.env.generation = parent_generation + 1
        return slot

    def close(self) -> None:
        snap, self.snapshot_id = self.snapshot_id, None
        if snap is not None and isinstance(self.substrate, Forking):
            self.substrate.drop_snapshot(snap)


METHODS: Registry[type[ForkMethod]] = Registry(
    "fork method", "--methods", {
        "replay": "drumsbench.branching.methods:Replay",
        "file": "drumsbench.branching.methods:FileCopy",
        "snapshot": "drumsbench.branching.methods:NativeSnapshot",
        "criu": "drumsbench.branching.desktop_criu:CriuFork",  # the desktop's live process tree
        "criu-cold": "drumsbench.branching.desktop_criu:ColdCriuFork",  # the same, no pool restored ahead
    }, "drumsbench.fork_methods",
    check=lambda obj: isinstance(obj, type) and issubclass(obj, ForkMethod), expected="a ForkMethod subclass")


def timed_fork(method: ForkMethod, parent_generation: int) -> tuple[Slot, float]:
    t0 = time.monotonic()
    slot = method.fork(parent_generation)
    return slot, time.monotonic() - t0
