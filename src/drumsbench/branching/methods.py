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

A ``Shippable`` method's prepared state travels as bytes (``pack`` where the parent lives,
``unpack`` into a method built for another substrate instance, e.g. on another Ray node):
``replay`` ships its recorded actions, ``file`` the work folder's tar, ``snapshot`` the substrate's
exported snapshot (a ``PortableSnapshots`` substrate).
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.plugins import Registry
from drumsbench.envs.base import Action, ActionSpec, Environment, MachineForks, Resumable, Task
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.base import Forking, PortableSnapshots, Snapshotting, Substrate


@dataclass(frozen=True)
class ForkCost:
    """What one continuation cost. ``creation_s``: making it, wherever that was paid (a restore made
    ahead of demand by a pool counts its own phases); ``handover_s``: what the caller of ``fork``
    waited; ``ahead``: it was made before it was asked for; ``phases``: the method's own split."""

    creation_s: float
    handover_s: float
    ahead: bool = False
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Requirements:
    """What a fork method needs of a run, checked before its parent is prepared: capabilities (or
    classes) of the substrate, of the substrate's sandboxes (when it declares their class) and of
    the environment."""

    substrate: tuple[type, ...] = ()
    sandbox: tuple[type, ...] = ()
    environment: tuple[type, ...] = ()

    def unmet(self, substrate_cls: type[Substrate], env_cls: type | None) -> list[str]:
        """What of it the run lacks, each as a phrase (empty: it fits)."""
        sandbox_cls = substrate_cls.sandbox_class
        out = [f"a substrate that is {r.__name__}" for r in self.substrate if not issubclass(substrate_cls, r)]
        if sandbox_cls is not None:
            out += [f"sandboxes that are {r.__name__}" for r in self.sandbox if not issubclass(sandbox_cls, r)]
        if env_cls is not None:
            out += [f"an environment that is {r.__name__}" for r in self.environment if not issubclass(env_cls, r)]
        return out


class ForkMethod(ABC):
    name: str

    @classmethod
    def requires(cls) -> Requirements:
        """What this method needs of the run (default: nothing; ``unmet`` checks it)."""
        return Requirements()

    @classmethod
    def machine_problem(cls) -> str | None:
        """What this machine lacks for the method (a tool not installed), or None."""
        return None

    @classmethod
    def unmet(cls, substrate_cls: type[Substrate], env_cls: type | None) -> str | None:
        """One line saying why this method cannot run with this substrate and environment (before
        anything is prepared), or None."""
        lacks = cls.requires().unmet(substrate_cls, env_cls)
        if lacks:
            kind = getattr(env_cls, "kind", None)
            run = f"--substrate {substrate_cls.name}" + (f" with the {kind} environment" if kind else "")
            return f"needs {' and '.join(lacks)}, which {run} lacks"
        return cls.machine_problem()

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

    def fork_cost(self, slot: Slot, wall_s: float) -> ForkCost:
        """The cost of the continuation ``fork`` just returned (``wall_s``: the call's wall time).
        Default: it was made while the caller waited. A method that makes continuations ahead of
        demand reports what making this one cost where it was paid."""
        return ForkCost(creation_s=wall_s, handover_s=wall_s)

    def _fresh(self, generation: int) -> Slot:
        slot = Slot(self.substrate, self.make_env())
        slot.provision()
        slot.env.generation = generation
        return slot


class Shippable(ABC):
    """Capability of a fork method: its prepared state as bytes. ``pack`` after ``prepare_to_ship``
    (where the parent is); ``unpack`` instead of ``prepare`` on a method built for another substrate
    instance, after which ``fork`` makes continuations there. ``close`` frees what ``unpack`` made."""

    def prepare_to_ship(self, parent: Slot) -> None:
        """``prepare`` for a method whose continuations are made elsewhere (default: ``prepare``;
        a method that readies continuations ahead of demand at ``prepare`` skips that here)."""
        assert isinstance(self, ForkMethod)
        self.prepare(parent)

    @classmethod
    def ship_problem(cls, substrate_cls: type[Substrate]) -> str | None:
        """Why this method cannot ship its prepared state from sandboxes of ``substrate_cls`` (one
        line naming the fix), or None (default: it always can)."""
        return None

    @abstractmethod
    def pack(self) -> bytes: ...

    @abstractmethod
    def unpack(self, data: bytes) -> None: ...


def shippable(name: str) -> bool:
    """True when the registered fork method ``name`` can ship its prepared state as bytes."""
    return issubclass(METHODS.load(name), Shippable)


def ship_problem(name: str, substrate_cls: type[Substrate]) -> str | None:
    """Why the registered fork method ``name`` cannot ship from ``substrate_cls`` (None: it can)."""
    method = METHODS.load(name)
    if not issubclass(method, Shippable):
        return "cannot ship its prepared state to Ray nodes yet"
    return method.ship_problem(substrate_cls)


class Replay(ForkMethod, Shippable):
    """The recorded actions are the whole prepared state (what ships)."""

    name = "replay"

    def pack(self) -> bytes:
        return json.dumps([[a.kind, a.payload] for a in self.recorded]).encode()

    def unpack(self, data: bytes) -> None:
        self.recorded = [ActionSpec(kind, payload) for kind, payload in json.loads(data)]

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


class FileCopy(ForkMethod, Shippable):
    name = "file"

    def prepare(self, parent: Slot) -> None:
        box = parent.sandbox
        assert box is not None
        res = box.exec(["tar", "-C", box.paths.work, "-cf", "-", "."], timeout=120, output_limit=1 << 30)
        if res.exit_code != 0 or res.truncated:
            raise SubstrateError(f"file: tar of the work folder failed (exit {res.exit_code})")
        self.files = _untar(res.stdout)

    def pack(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, data in sorted(self.files.items()):
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def unpack(self, data: bytes) -> None:
        self.files = _untar(data)

    def fork(self, parent_generation: int) -> Slot:
        slot = self._fresh(parent_generation + 1)
        box = slot.sandbox
        assert box is not None
        box.put_files(box.paths.work, self.files)
        if isinstance(slot.env, Resumable):  # environments with live applications start them on the files
            slot.env.resume(self.task)
        return slot


class NativeSnapshot(ForkMethod, Shippable):
    """The substrate's own live snapshot (``Snapshotting`` sandbox, ``Forking`` substrate); it ships
    when the substrate has ``PortableSnapshots``."""

    name = "snapshot"
    snapshot_id: str | None = None

    @classmethod
    def requires(cls) -> Requirements:
        return Requirements(substrate=(Forking,), sandbox=(Snapshotting,))
    handover: dict[str, object] | None = None  # a MachineForks parent's: what its continuations take over

    def prepare(self, parent: Slot) -> None:
        box = parent.sandbox
        if not isinstance(box, Snapshotting) or not isinstance(self.substrate, Forking):
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} has no snapshot/fork")
        if isinstance(parent.env, MachineForks):
            self.handover = parent.env.handover()
        self.snapshot_id = box.snapshot()

    def fork(self, parent_generation: int) -> Slot:
        if not isinstance(self.substrate, Forking) or self.snapshot_id is None:
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} has no snapshot/fork")
        box = self.substrate.fork(self.snapshot_id)
        slot = Slot(self.substrate, self.make_env())
        slot.sandbox = box
        slot.env.attach(box)
        slot.env.generation = parent_generation + 1
        if isinstance(slot.env, MachineForks) and self.handover is not None:
            try:  # the running instance the fork copied
                slot.env.adopt_fork(self.task, list(self.recorded), self.handover)
            except BaseException:
                slot.destroy()
                raise
        return slot

    @classmethod
    def ship_problem(cls, substrate_cls: type[Substrate]) -> str | None:
        if issubclass(substrate_cls, PortableSnapshots):
            return None
        return (f"substrate {substrate_cls.name} cannot ship a snapshot to Ray nodes; use --substrate overlay "
                "(or --methods replay,file)")

    def pack(self) -> bytes:
        if not isinstance(self.substrate, PortableSnapshots) or self.snapshot_id is None:
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} cannot ship a snapshot")
        return self.substrate.export_snapshot(self.snapshot_id)

    def unpack(self, data: bytes) -> None:
        if not isinstance(self.substrate, PortableSnapshots):
            raise UsageError(f"--methods snapshot: substrate {self.substrate.name} cannot ship a snapshot")
        self.snapshot_id = self.substrate.import_snapshot(data)

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
        # podman's checkpoint/restore of the whole container (the desktop on podman)
        "podman-checkpoint": "drumsbench.branching.podman_checkpoint:PodmanCheckpointFork",
    }, "drumsbench.fork_methods",
    check=lambda obj: isinstance(obj, type) and issubclass(obj, ForkMethod), expected="a ForkMethod subclass")


def costed_fork(method: ForkMethod, parent_generation: int) -> tuple[Slot, ForkCost]:
    """One ``fork`` and what it cost (``ForkMethod.fork_cost``)."""
    t0 = time.monotonic()
    slot = method.fork(parent_generation)
    return slot, method.fork_cost(slot, time.monotonic() - t0)


def timed_fork(method: ForkMethod, parent_generation: int) -> tuple[Slot, float]:
    """One ``fork`` and its creation cost in seconds (restore included wherever it was paid)."""
    slot, cost = costed_fork(method, parent_generation)
    return slot, cost.creation_s


def fork_parallel(method: ForkMethod, n: int, generation: int,
                  costs: list[ForkCost] | None = None) -> tuple[list[float], float, list[str]]:
    """n forks at once: (creation cost of each, wall time of all, errors); each one's ``ForkCost``
    appended to ``costs`` when given. Destroys them all."""
    times: list[float] = []
    made: list[Slot] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            slot, cost = costed_fork(method, generation)
            with lock:
                made.append(slot)
                times.append(cost.creation_s)
                if costs is not None:
                    costs.append(cost)
        except Exception as e:  # a failed fork is a result of the method
            with lock:
                errors.append(f"parallel fork: {type(e).__name__}: {e}"[:300])

    t0 = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for slot in made:
        slot.destroy()
    return times, wall, errors
