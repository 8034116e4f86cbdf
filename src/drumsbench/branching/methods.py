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

from drumsbench.envs.base import Action, ActionSpec, Environment, Task
from drumsbench.errors import SubstrateError, UsageError
from drumsbench.rollout import Slot
from drumsbench.substrates.base import Substrate


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
        resume = getattr(slot.env, "resume", None)
        if resume is not None:  # environments with live applications start them on the copied files
            resume(self.task)
        return slot


class NativeSnapshot(ForkMethod):
    name = "snapshot"

    def prepare(self, parent: Slot) -> None:
        box = parent.sandbox
        if not self.substrate.capabilities.snapshot or not hasattr(box, "snapshot"):
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} has no snapshot/fork")
        self.snapshot_id = box.snapshot()  # type: ignore[union-attr]

    def fork(self, parent_generation: int) -> Slot:
        box = self.substrate.fork(self.snapshot_id)  # type: ignore[attr-defined]
        slot = Slot(self.substrate, self.make_env())
        slot.sandbox = box
        slot.env.attach(box)
        slot.env.generation = parent_generation + 1
        return slot

    def close(self) -> None:
        drop = getattr(self.substrate, "drop_snapshot", None)
        if drop is not None and hasattr(self, "snapshot_id"):
            drop(self.snapshot_id)


METHODS: dict[str, type[ForkMethod]] = {m.name: m for m in (Replay, FileCopy, NativeSnapshot)}


def register(method: type[ForkMethod]) -> None:
    """Environments add their own methods (e.g. the desktop environment's ``criu``)."""
    METHODS[method.name] = method


def timed_fork(method: ForkMethod, parent_generation: int) -> tuple[Slot, float]:
    t0 = time.monotonic()
    slot = method.fork(parent_generation)
    return slot, time.monotonic() - t0
