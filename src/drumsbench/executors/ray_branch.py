"""``drumsbench branch --executor ray``: continuations made and checked on the Ray node that runs them.

The driver (``experiments/branch.py``) prepares the parent on its own node and packs each fork
method's prepared state (``Shippable.pack``: replay's recorded actions, file's work tree,
snapshot's exported overlay layers). The bytes enter Ray's object store once (``ray.put`` on the
driver's node); every node pulls them itself (``ray.get`` inside the node's actor: the transfer,
timed apart from creation) and unpacks them onto a substrate of its own (``Shippable.unpack``).
Nothing travels by path: the bytes are all a node gets.

One ``BranchRunner`` actor per alive node, pinned to it (``NodeAffinitySchedulingStrategy``, hard,
``num_cpus=0``, no restarts); it checks in ``setup`` that it runs on the node it was placed on. A
node is labelled by its custom resource ``node_<i>`` (``drumsbench cluster up``, the tests'
cluster) when it has one, else ``head`` (the driver's node) or its id. Each node's substrate has
a run id of its own (``<run>-<label>``), because nodes on one host share its state folder; it runs
the isolation positive control at set-up. With two nodes or more the canary registry is the
cluster's (``executors.ray.CanaryHub``), as for ``run``.

Continuations are handed out round-robin by sequence number; each node makes its share one at a
time (the nodes at once): fork (creation time), ``Environment.capture()`` compared with the
prepared capture (faithfulness, on the node), then the continuation runs to the end there and its
``AttemptRecord`` comes back; the driver alone writes the ledger. A node that stops answering
(``RayActorError``) is lost for the rest of the run, as in ``run --executor ray``: its in-flight
continuation is recorded by the driver as ``invalid/substrate_failure`` (``extra["lost_node"]``;
never dropped, never retried under the same sequence number), the continuations it had not begun
go to the live nodes, and an error line of the method names the node. When no node is left, the
ones not begun are not made (an error line says how many). A lost node on the driver's host
cannot clean up: at close the driver removes what its substrate left (``Substrate.gc`` of the
node's run id).

Ray is imported only inside the functions here; ``executors.ray.connect`` applies the loopback
settings of ``ray_env`` before Ray starts or is joined.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsbench.branching.methods import METHODS, ForkMethod, Shippable, fork_parallel, timed_fork
from drumsbench.core.errors import UsageError
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.base import Environment, Task
from drumsbench.executors.ray import CanaryHub, ClusterCanaries, connect, lost_node_record
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.attempt import RolloutConfig, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, positive_control
from drumsbench.substrates.base import Substrate, with_flavor


@dataclass(frozen=True)
class BranchSpec:
    """What every node needs to continue the prepared state (sent once, at actor creation)."""

    run_id: str
    task: Task
    make_env: Callable[[], Environment[Any]]
    policy: Policy  # the continuation policy; each continuation gets a copy
    rollout: RolloutConfig
    seed: int
    k: int
    prepared: dict[str, Any]  # the parent's ``Environment.capture()``: what every continuation must match
    parent: str  # the parent sandbox's id (for the records)
    substrate_cls: type[Substrate]
    driver_host: str
    driver_state_dir: str
    env_kind: str = ""  # the suite's environment kind, for the records the driver writes itself

    def state_dir(self) -> Path:
        """The driver's state folder on the driver's host; the node's own elsewhere."""
        if socket.gethostname() == self.driver_host:
            return Path(self.driver_state_dir)
        from drumsbench.core import host_state

        return host_state.state_dir()

    def node_run_id(self, label: str) -> str:
        """The run id of a node's substrate (nodes on one host share its state folder)."""
        return f"{self.run_id}-{label}"

    def lost(self, seq: int, method: str, window: str, node_id: str, label: str, host: str, reason: str,
             t_submit: float) -> AttemptRecord:
        """The driver's record of continuation ``seq`` whose node was lost while it ran: invalid,
        the infrastructure's (the node stopped answering; nothing the policy does reaches Ray)."""
        return lost_node_record(
            run_id=self.run_id, seq=seq, task=self.task.id, substrate=self.substrate_cls.name, env=self.env_kind,
            policy=self.policy.name, host=host, node_id=node_id, node_name=f"{label} ({node_id[:8]})",
            what="lost mid-continuation", reason=reason, t_start=t_submit, window=window,
            extra={"fork_method": method, "k": self.k, "parent": self.parent, "node_label": label})


@dataclass
class Continued:
    """One continuation as a node made and ran it."""

    seq: int
    node_id: str
    creation_s: float | None  # None: the fork failed (``error``) or the node was lost (``record`` invalid)
    faithful: dict[str, bool]
    record: AttemptRecord | None
    error: str | None = None


class BranchRunner:
    """Makes, checks and runs continuations on one node (the body of the Ray actor)."""

    def __init__(self, spec: BranchSpec, label: str, node_id: str, hub: Any = None) -> None:
        self.spec, self.label, self.node_id = spec, label, node_id
        self.host = socket.gethostname()
        if hub is not None:
            import ray

            self.canaries: CanaryRegistry = ClusterCanaries(hub, ray.get)
        else:
            self.canaries = CanaryRegistry()
        self.substrate: Substrate | None = None
        self.methods: dict[str, ForkMethod] = {}
        self.run_id = spec.node_run_id(label)
        self._registered = False

    def setup(self) -> dict[str, Any]:
        """Check the placement, create the node's substrate, run the isolation positive control."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        info: dict[str, Any] = {"host": self.host, "node_id": here, "missing": self.spec.substrate_cls.missing()}
        if here != self.node_id:
            info["missing"] = f"placed on node {here[:8]}, not on {self.node_id[:8]}"
        if info["missing"] is not None:
            return info
        self.substrate = with_flavor(self.spec.substrate_cls(self.run_id, self.spec.state_dir()),
                                     self.spec.make_env().image_flavor)
        if self.host != self.spec.driver_host:  # `drumsbench gc` on this host cleans up after a crash
            from drumsbench.core import host_state

            host_state.register(self.run_id, [self.substrate.name])
            self._registered = True
        control = positive_control(self.substrate)
        info["control"] = (control.fired, f"node {self.label} ({here[:8]}) on {self.host}: {control.detail}")
        return info

    def install(self, name: str, refs: list[Any]) -> tuple[float, float, int]:
        """Pull the shipped bytes of method ``name`` (``refs[0]``, left unresolved by Ray so that the
        pull is timed here) and unpack them; returns (transfer s, unpack s, bytes)."""
        import ray

        assert self.substrate is not None
        spec = self.spec
        method = METHODS[name](self.substrate, spec.make_env, spec.task, spec.task.branch_prefix(spec.k),
                               spec.rollout.step_timeout_s)
        if not isinstance(method, Shippable):
            raise UsageError(f"--methods {name}: cannot ship its prepared state to Ray nodes")
        t0 = time.monotonic()
        data = ray.get(refs[0])
        t1 = time.monotonic()
        method.unpack(bytes(data))
        self.methods[name] = method
        return t1 - t0, time.monotonic() - t1, len(data)

    def continuation(self, name: str, seq: int, generation: int, window: str) -> Continued:
        """Fork one continuation, check it against the prepared state, run it to the end, destroy it."""
        spec = self.spec
        try:
            child, took = timed_fork(self.methods[name], generation)
        except Exception as e:  # a failed fork is a result of the method
            return Continued(seq, self.node_id, None, {}, None, f"fork {seq} on {self.label}: {type(e).__name__}: "
                                                                 f"{e}"[:300])
        try:
            dims = child.env.compare(spec.prepared, child.env.capture())
            meta: dict[str, object] = {"window": window, "host": self.host, "executor": "ray",
                    "extra": {"fork_method": name, "k": spec.k, "parent": spec.parent, "creation_s": took,
                              "faithful": dims, "node": self.node_id, "node_label": self.label}}
            rec = run_attempt(child, spec.task, copy.deepcopy(spec.policy), spec.rollout, self.canaries,
                              run_id=spec.run_id, seq=seq, seed=spec.seed, prepared=spec.prepared, meta=meta)
            return Continued(seq, self.node_id, took, dims, rec)
        finally:
            child.destroy()

    def parallel(self, name: str, n: int, generation: int) -> tuple[list[float], float, list[str]]:
        """``n`` forks at once on this node (``fork_parallel``), destroyed after."""
        return fork_parallel(self.methods[name], n, generation)

    def drop(self, name: str) -> None:
        """Free what ``install`` made for ``name`` (an imported snapshot's layers stay until close)."""
        method = self.methods.pop(name, None)
        if method is not None:
            method.close()

    def close(self) -> list[str]:
        """Destroy everything of this node's substrate; returns what its leftover check still finds."""
        for name in list(self.methods):
            with contextlib.suppress(Exception):
                self.drop(name)
        left: list[str] = []
        if self.substrate is not None:
            with contextlib.suppress(Exception):
                self.substrate.close()
            left = self.substrate.leftovers()
        if self._registered:
            from drumsbench.core import host_state

            host_state.unregister(self.run_id)
        return left


@dataclass
class Node:
    """A node of the branch run as the driver sees it."""

    node_id: str
    label: str
    actor: Any
    host: str = ""
    lost: str | None = None  # why it is no longer used


@dataclass
class Shipped:
    """One method's prepared state as shipped: ``put_s`` on the driver; per node id (transfer s, unpack s)."""

    bytes: int
    put_s: float
    per_node: dict[str, tuple[float, float]] = field(default_factory=dict)


def node_label(resources: dict[str, Any], node_id: str, driver_node: str) -> str:
    """``node_<i>`` from the node's custom resources, else ``head`` for the driver's node, else its id."""
    own = sorted(r for r in resources if r.startswith("node_") and r[5:].isdigit())
    if own:
        return own[0]
    return "head" if node_id == driver_node else node_id[:8]


class BranchCluster:
    """The driver's side: connect, one ``BranchRunner`` per alive node, ship, continue, close.

    Use as a context manager; ``address`` as for ``run --executor ray`` (None: a Ray of its own on
    loopback; already connected: that connection). ``controls`` holds each node's isolation
    positive control once entered; ``events`` receives one line per notable event."""

    def __init__(self, address: str | None, spec: BranchSpec, events: Callable[[str], None]) -> None:
        self.address, self.spec, self.events = address, spec, events
        self.nodes: list[Node] = []
        self.controls: list[tuple[bool, str]] = []
        self.leftovers: list[str] = []
        self._ray: Any = None
        self._disconnect: Callable[[], None] = lambda: None
        self._hub: Any = None
        self._refs: list[Any] = []

    def __enter__(self) -> BranchCluster:
        self._ray, self._disconnect = connect(self.address)
        try:
            self._start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _start(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        here = ray.get_runtime_context().get_node_id()
        alive = sorted((n["NodeID"], n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive"))
        if len(alive) >= 2:
            self._hub = ray.remote(CanaryHub).options(num_cpus=0, max_restarts=0, scheduling_strategy=(
                NodeAffinitySchedulingStrategy(here, soft=False))).remote()
        actor_cls = ray.remote(BranchRunner)
        for node_id, resources in alive:
            label = node_label(resources, node_id, here)
            actor = actor_cls.options(
                num_cpus=0, max_concurrency=2, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self.spec, label, node_id, self._hub)
            self.nodes.append(Node(node_id, label, actor))
        setups = [n.actor.setup.remote() for n in self.nodes]
        ready = []
        for node, ref in zip(self.nodes, setups, strict=True):
            try:
                info = ray.get(ref, timeout=300)
            except Exception as e:
                info = {"missing": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            if info.get("missing"):
                self.events(f"ray: node {node.label} left out: {info['missing']}")
                with contextlib.suppress(Exception):
                    ray.kill(node.actor, no_restart=True)
                continue
            node.host = info["host"]
            self.controls.append(info["control"])
            ready.append(node)
        self.nodes = ready
        if not ready:
            raise UsageError("--executor ray: no node can run the branch's substrate "
                             f"({self.spec.substrate_cls.name})")

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.lost is None]

    def _lose(self, node: Node, e: BaseException) -> str:
        node.lost = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}" if str(e).strip() else \
            type(e).__name__
        line = f"ray node {node.label} on {node.host} lost: {node.lost}"
        self.events(line)
        return line

    def ship(self, name: str, data: bytes) -> tuple[Shipped, list[str]]:
        """Put ``data`` in the object store once; every live node pulls and unpacks it (at once)."""
        ray = self._ray
        t0 = time.monotonic()
        ref = ray.put(data)
        shipped = Shipped(bytes=len(data), put_s=time.monotonic() - t0)
        self._refs.append(ref)
        errors = []
        calls = {n.actor.install.remote(name, [ref]): n for n in self.live()}
        for call, node in calls.items():
            try:
                transfer, unpack, size = ray.get(call, timeout=600)
                if size != len(data):
                    raise RuntimeError(f"received {size} bytes of {len(data)}")
                shipped.per_node[node.node_id] = (transfer, unpack)
            except Exception as e:
                errors.append(self._lose(node, e))
        return shipped, errors

    def continuations(self, name: str, seqs: list[int], generation: int, window: str,
                      on_result: Callable[[Continued], None]) -> list[str]:
        """Hand out ``seqs`` round-robin over the nodes that installed ``name``, one at a time per node
        (nodes at once); each result goes to ``on_result`` on this thread. A node lost meanwhile: its
        in-flight continuation comes back as a ``Continued`` with the driver's invalid record
        (``BranchSpec.lost``), its queue goes to the live nodes. Returns error lines."""
        from ray.exceptions import RayActorError

        ray = self._ray
        nodes = self.live()
        queues = {n.node_id: [s for i, s in enumerate(seqs) if nodes[i % len(nodes)] is n] for n in nodes}
        errors: list[str] = []
        flights: dict[Any, tuple[Node, int, float]] = {}

        def submit(node: Node) -> None:
            q = queues[node.node_id]
            if q and node.lost is None:
                seq = q.pop(0)
                flights[node.actor.continuation.remote(name, seq, generation, window)] = (node, seq, time.time())

        for n in nodes:
            submit(n)
        while flights:
            done, _ = ray.wait(list(flights), num_returns=1)
            for ref in done:
                node, seq, t_submit = flights.pop(ref)
                try:
                    result = ray.get(ref)
                except RayActorError as e:
                    line = self._lose(node, e)
                    with contextlib.suppress(Exception):
                        ray.kill(node.actor, no_restart=True)
                    on_result(Continued(seq, node.node_id, None, {}, self.spec.lost(
                        seq, name, window, node.node_id, node.label, node.host, node.lost or "", t_submit)))
                    left, queues[node.node_id] = queues[node.node_id], []
                    heirs = [n for n in nodes if n.lost is None]
                    for i, s in enumerate(left):
                        if heirs:
                            queues[heirs[i % len(heirs)].node_id].append(s)
                    errors.append(line + f" (continuation {seq} recorded invalid/substrate_failure; "
                                  + (f"{len(left)} not begun went to {len(heirs)} live node(s))" if heirs else
                                     f"no live node left: {len(left)} not made)"))
                    for heir in heirs:
                        if not any(f[0] is heir for f in flights.values()):
                            submit(heir)
                    continue
                on_result(result)
                submit(node)
        return errors

    def parallel(self, name: str, n: int, generation: int) -> tuple[list[float], float, list[str]]:
        """``n`` forks at once across the live nodes (their shares at once): (times, wall, errors)."""
        ray = self._ray
        nodes = self.live()
        shares = [n // len(nodes) + (i < n % len(nodes)) for i in range(len(nodes))]
        t0 = time.monotonic()
        calls = {node.actor.parallel.remote(name, share, generation): node
                 for node, share in zip(nodes, shares, strict=True) if share}
        times: list[float] = []
        errors: list[str] = []
        for call, node in calls.items():
            try:
                t, _, err = ray.get(call, timeout=600)
                times += t
                errors += [f"{node.label}: {e}" for e in err]
            except Exception as e:
                errors.append(self._lose(node, e))
        return times, time.monotonic() - t0, errors

    def drop(self, name: str) -> None:
        for n in self.live():
            with contextlib.suppress(Exception):
                self._ray.get(n.actor.drop.remote(name), timeout=120)

    def _close(self) -> None:
        ray = self._ray
        try:
            calls = {n.actor.close.remote(): n for n in self.live()}
            for call, node in calls.items():
                try:
                    left = ray.get(call, timeout=120)
                except Exception as e:
                    left = [f"close failed: {type(e).__name__}"]
                self.leftovers += [f"{node.label}: {x}" for x in left]
            here = socket.gethostname()
            for node in self.nodes:
                if node.lost is not None and node.host == here:
                    # a lost node could not clean up; its substrate's run id is its own
                    with contextlib.suppress(Exception):
                        removed = self.spec.substrate_cls.gc(Path(self.spec.state_dir()),
                                                             {self.spec.node_run_id(node.label)})
                        if removed:
                            self.events(f"ray: removed what lost node {node.label} left on {here}: "
                                        f"{'; '.join(removed[:5])}")
            actors = [n.actor for n in self.nodes] + ([self._hub] if self._hub is not None else [])
            for actor in actors:  # every node's, the live and the lost, and the canary hub
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            self._refs.clear()
        finally:
            self._disconnect()
