"""The Ray executor: attempts run in Ray actors on the cluster's nodes; the driver keeps the ledger.

One ``NodeRunner`` actor per alive node, pinned there (``NodeAffinitySchedulingStrategy``), owns
that node's substrate and sandboxes: ``concurrency`` slots per node, each with its environment,
policy and at most one attempt at a time (a threaded actor, ``max_concurrency`` = slots + 1). The
driver hands out ``Work`` (sequence number, task, fault, drawn from the run's ``Job`` as in
process), receives ``AttemptRecord`` objects and passes them to the sink on its own thread, so the
ledger keeps one writer.

Each record says where it ran: ``host`` (the node's hostname), ``executor = "ray"``, a run-wide
``worker`` number (node index x slots + slot) and ``extra["node"]`` (the Ray node id).

A node that stops answering (``RayActorError``: ``ActorUnavailableError`` or ``ActorDiedError``)
is lost for the rest of the run: each of its in-flight attempts is recorded by the driver as
``invalid/substrate_failure`` (never dropped, never retried under the same sequence number), and
the other nodes go on. When every node is lost the run stops and is marked interrupted, so it can
be resumed.

SIGINT/SIGTERM in the driver: as in process, work stops, the nodes destroy their sandboxes and
in-flight attempts are dropped (not recorded).

Canaries: with two nodes or more, one registry for the whole cluster (a ``CanaryHub`` actor on
the driver's node; each node's ``ClusterCanaries`` issues, retires and asks it), so a canary of a
sandbox on node A found inside one on node B is contamination; and a cross-node positive control
runs at the start: a canary of a sandbox on node A is planted in a sandbox on node B, and B's check
must find it (a per-node registry would not: the control says so too).

A ``Session`` (``with session(...)``, used by the sweep) lets a caller that runs several windows on
one connection restrict a window to the first ``node_limit`` nodes (the node-alone baseline) and
learn when each window's nodes were ready (``ready_at``); in a session the job's deadline is moved
by the nodes' set-up time, so a window has its full length of work after set-up.

Ray is imported only here; ``drumsbench.executors.ray_env`` keeps Ray on loopback.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.base import Environment, Task
from drumsbench.executors import ray_env
from drumsbench.executors.base import Job, Work
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, contamination, plant, positive_control
from drumsbench.substrates.base import Sandbox, Substrate, with_flavor

log = logging.getLogger("drumsbench.ray")


def missing() -> str | None:
    """``None`` when Ray can be imported, else how to install it."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed; install it with: pip install 'drumsbench[ray]'"
    return None


def check_address(address: str | None) -> None:
    """``UsageError`` unless ``address`` (``--ray-address``) can be joined on loopback."""
    if not address:
        return
    if not ray_env.is_loopback_address(address):
        raise UsageError(f"--ray-address: {address} is not a loopback address; on these machines Ray must stay "
                         "on 127.0.0.1 (see docs/ray.md)")
    if "RAY_AUTH_TOKEN_PATH" not in os.environ:
        raise UsageError("--ray-address: set RAY_AUTH_TOKEN_PATH to the token file the cluster was started with "
                         "(every process that joins it must share it; see docs/ray.md)")


def executor_options(executor: str, address: str | None) -> dict[str, object]:
    """``RunConfig`` fields for ``--executor``/``--ray-address`` (empty for local); ``UsageError`` for bad input."""
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor: {executor!r} is not one of local, ray")
    if address is not None and executor != "ray":
        raise UsageError("--ray-address: only with --executor ray")
    if executor == "local":
        return {}
    problem = missing()
    if problem:
        raise UsageError(f"--executor ray: {problem}")
    check_address(address)
    return {"executor": executor, "ray_address": address}


def connect(address: str | None = None, object_store_bytes: int = ray_env.OBJECT_STORE_BYTES
            ) -> tuple[Any, Callable[[], None]]:
    """Connect this process to Ray on loopback; returns (the ``ray`` module, disconnect).

    Already connected: that connection, and a disconnect that does nothing. ``address`` None:
    start a single-node Ray of our own (loopback settings, no dashboard, capped object store),
    which disconnect stops. Otherwise join ``address`` (``auto`` or HOST:PORT on loopback).
    """
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return sys.modules["ray"], lambda: None
    check_address(address)
    imported = "ray" in sys.modules
    env = ray_env.apply(new_token=not address)  # before Ray reads its settings
    import ray

    if imported:  # Ray read its settings at import: make it read them again
        ray_env.reload_auth()
    try:
        kwargs: dict[str, Any] = {"_node_ip_address": ray_env.LOOPBACK, "logging_level": logging.WARNING,
                                  "log_to_driver": True}
        if address:
            kwargs["address"] = address
        else:
            kwargs.update(ray_env.NODE_KWARGS, object_store_memory=object_store_bytes, address="local")
        ray.init(**kwargs)
    except Exception as e:
        with contextlib.suppress(Exception):
            ray.shutdown()
        env.restore()
        flag, where = ("--ray-address", f"join {address}") if address else ("--executor ray", "start a local Ray")
        raise UsageError(f"{flag}: cannot {where}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None

    def disconnect() -> None:
        ray.shutdown()
        env.restore()

    return ray, disconnect


@dataclass
class Session:
    """Settings and findings shared by the windows one caller runs on one Ray connection."""

    node_limit: int | None = None  # run on the first (by node id) this many nodes only
    ready_at: list[float] = field(default_factory=list)  # per execute: when the nodes were ready (time.time)
    nodes_used: list[list[str]] = field(default_factory=list)  # per execute: the node ids that ran it


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("drumsbench_ray_session", default=None)


@contextlib.contextmanager
def session(s: Session) -> Iterator[Session]:
    """Run ``RayExecutor.execute`` calls in this thread under ``s`` (see the module's docstring)."""
    token = _SESSION.set(s)
    try:
        yield s
    finally:
        _SESSION.reset(token)


def cluster_nodes(ray: Any) -> list[tuple[str, str, bool]]:
    """(node id, hostname, alive) of every node the cluster knows, by node id."""
    return sorted((n["NodeID"], str(n.get("NodeManagerHostname", "?")), bool(n.get("Alive")))
                  for n in ray.nodes())


class CanaryHub:
    """The cluster's one canary registry (the body of an actor on the driver's node): live tokens
    and the most recently retired, from every node."""

    def __init__(self, keep_retired: int = 256) -> None:
        self._live: dict[str, str] = {}
        self._retired: deque[str] = deque(maxlen=keep_retired)

    def add(self, token: str, owner: str) -> None:
        self._live[token] = owner

    def retire(self, token: str) -> None:
        if self._live.pop(token, None) is not None:
            self._retired.append(token)

    def others(self, token: str) -> list[str]:
        """Live tokens of other attempts (``CanaryRegistry.others``: a retired one is not foreign)."""
        return [t for t in self._live if t != token]


class ClusterCanaries(CanaryRegistry):
    """A node's view of the cluster's registry: every token issued here is also put in the hub
    (before it is planted), and ``others`` are the whole cluster's. ``get`` is ``ray.get``."""

    def __init__(self, hub: Any, get: Callable[[Any], Any]) -> None:
        super().__init__()
        self.hub, self.get = hub, get

    def issue(self, owner: str) -> str:
        token = super().issue(owner)
        self.get(self.hub.add.remote(token, owner))  # known cluster-wide before it is planted
        return token

    def retire(self, token: str) -> None:
        super().retire(token)
        # no wait: the hub runs one caller's calls in order, so this node's next token and gate
        # see the retirement
        self.hub.retire.remote(token)

    def others(self, token: str) -> list[str]:
        return list(self.get(self.hub.others.remote(token)))


@dataclass(frozen=True)
class RemoteJob:
    """The picklable part of a ``Job`` that every node needs (sent once, at actor creation)."""

    run_id: str
    tasks: dict[str, Task]
    make_policy: Callable[[], Policy]
    make_env: Callable[[], Environment[Any]]
    rollout: RolloutConfig
    seed: int
    meta: dict[str, object]
    substrate_cls: type[Substrate]
    driver_host: str
    driver_state_dir: str
    hidden: tuple[str, ...] = ()  # the driver substrate's answer-key folders (``Substrate.hide``)

    @classmethod
    def of(cls, job: Job, substrate: Substrate) -> RemoteJob:
        return cls(run_id=job.run_id, tasks={t.id: t for t in job.tasks}, make_policy=job.make_policy,
                   make_env=job.make_env, rollout=job.rollout, seed=job.seed, meta=dict(job.meta),
                   substrate_cls=type(substrate), driver_host=socket.gethostname(),
                   driver_state_dir=str(substrate.state_dir), hidden=tuple(map(str, substrate.hidden)))

    def state_dir(self) -> Path:
        """The driver's state folder on the driver's host; the node's own elsewhere."""
        if socket.gethostname() == self.driver_host:
            return Path(self.driver_state_dir)
        from drumsbench.core import host_state as state

        return state.state_dir()


class NodeRunner:
    """Runs attempts on one node (the body of the Ray actor; plain class, testable without Ray)."""

    def __init__(self, spec: RemoteJob, node_index: int, slots: int, node_id: str, hub: Any = None) -> None:
        self.spec = spec
        self.node_index = node_index
        self.slots_n = slots
        self.node_id = node_id
        self.host = socket.gethostname()
        if hub is not None:
            import ray

            self.canaries: CanaryRegistry = ClusterCanaries(hub, ray.get)
        else:
            self.canaries = CanaryRegistry()
        self._xbox: tuple[Sandbox, str] | None = None  # the cross-node control's sandbox A
        self.substrate: Substrate | None = None
        self.slots: dict[int, tuple[Slot, Policy]] = {}
        self._live: dict[int, Sandbox] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._registered = False

    def setup(self) -> dict[str, Any]:
        """Create the node's substrate and run the isolation positive control on it."""
        cls = self.spec.substrate_cls
        env = self.spec.make_env()
        info: dict[str, Any] = {"host": self.host, "node_id": self.node_id, "missing": cls.missing(),
                                "env": env.kind}
        if info["missing"] is not None:
            return info
        state_dir = self.spec.state_dir()
        self.substrate = with_flavor(cls(self.spec.run_id, state_dir), env.image_flavor)
        self.substrate.hide(*map(Path, self.spec.hidden))
        if self.host != self.spec.driver_host:  # let `drumsbench gc` on this host clean after a crash
            from drumsbench.core import host_state as state

            state.register(self.spec.run_id, [cls.name])
            self._registered = True
        control = positive_control(self.substrate)
        info["control"] = (control.fired, control.detail)
        return info

    def _slot(self, k: int) -> tuple[Slot, Policy]:
        if k not in self.slots:
            worker = self.node_index * self.slots_n + k

            def track(box: Sandbox | None) -> None:
                with self._lock:
                    if box is None:
                        self._live.pop(k, None)
                    else:
                        self._live[k] = box

            assert self.substrate is not None
            self.slots[k] = (Slot(self.substrate, self.spec.make_env(), worker=worker, on_sandbox=track),
                             self.spec.make_policy())
        return self.slots[k]

    def attempt(self, k: int, seq: int, task_id: str, fault: InvalidCause | None) -> AttemptRecord:
        slot, policy = self._slot(k)
        spec = self.spec
        meta = {**spec.meta, "host": self.host, "executor": RayExecutor.name, "concurrency": self.slots_n,
                "extra": {"node": self.node_id}}
        return run_attempt(slot, spec.tasks[task_id], policy, spec.rollout, self.canaries, run_id=spec.run_id,
                           seq=seq, seed=spec.seed, fault=fault, meta=meta)

    def ping(self) -> str:
        return self.node_id

    def live(self) -> int:
        """Sandboxes this node's slots hold now (between attempts too, as in process)."""
        with self._lock:
            return len(self._live)

    # -- the cross-node positive control: A plants, B must find A's canary, A must stay clean -----
    def xcontrol_source(self) -> str:
        """Sandbox A on this node, with a canary from the cluster's registry; returns the token
        (it travels to node B in memory, through the driver, never through a file or a command line)."""
        assert self.substrate is not None
        box = self.substrate.create()
        token = self.canaries.issue(box.id)
        plant(box, token)
        self._xbox = (box, token)
        return token

    def xcontrol_sink(self, leaked: str) -> tuple[bool, bool]:
        """Sandbox B on this node holds A's canary (the leak): (the cluster's registry found it, a
        registry of this node alone would have)."""
        assert self.substrate is not None
        box = self.substrate.create()
        try:
            token = self.canaries.issue(box.id)
            plant(box, token)
            box.write_file(f"{box.paths.tmp}/leaked-from-another-node", leaked.encode())
            folders = [box.paths.work, box.paths.home, box.paths.tmp]
            found = contamination(box, folders, token, self.canaries)
            alone = CanaryRegistry()  # what a per-node registry knows: this node's own tokens only
            alone.issue(box.id)
            local = contamination(box, folders, token, alone)
            self.canaries.retire(token)
            return found is not None and leaked in found, local is not None and leaked in local
        finally:
            box.destroy()

    def xcontrol_finish(self) -> bool:
        """Sandbox A reported clean (its own canary is not foreign to it); destroys it."""
        if self._xbox is None:
            return False
        box, token = self._xbox
        self._xbox = None
        try:
            folders = [box.paths.work, box.paths.home, box.paths.tmp]
            return contamination(box, folders, token, self.canaries) is None
        finally:
            self.canaries.retire(token)
            box.destroy()

    def stop(self) -> None:
        """Kill what is running (the driver was interrupted): destroy the live sandboxes."""
        self._stopped.set()
        with self._lock:
            boxes = list(self._live.values())
        for box in boxes:
            with contextlib.suppress(Exception):
                box.destroy()

    def close(self) -> None:
        """Destroy every sandbox of this node."""
        if self._xbox is not None:
            with contextlib.suppress(Exception):
                self._xbox[0].destroy()
            self._xbox = None
        for slot, _ in self.slots.values():
            with contextlib.suppress(Exception):
                slot.destroy()
        if self.substrate is not None:
            with contextlib.suppress(Exception):
                self.substrate.close()
        if self._registered:
            from drumsbench.core import host_state as state

            state.unregister(self.spec.run_id)

    def leftovers(self) -> list[str]:
        """What the substrate says is left of the run on this host (after every node here closed)."""
        return self.substrate.leftovers() if self.substrate is not None else []


@dataclass
class _Node:
    index: int
    node_id: str
    actor: Any
    host: str = ""
    env: str = ""
    lost: bool = False
    lost_reason: str = ""


@dataclass
class _Flight:
    node: _Node
    slot: int
    work: Work
    t_submit: float


def lost_node_record(*, run_id: str, seq: int, task: str, substrate: str, env: str, policy: str, host: str,
                     node_id: str, node_name: str, what: str, reason: str, t_start: float,
                     lost: bool = True, **fields: Any) -> AttemptRecord:
    """The driver's record of an attempt (or continuation) whose Ray node was lost while it ran, or
    that could not be placed: invalid, ``substrate_failure``, the infrastructure's (a node stops
    answering; nothing the policy does reaches Ray). ``node_name`` and ``what`` make the detail
    (``ray node NAME on HOST WHAT: REASON``); ``extra`` gains ``node`` and ``lost_node`` (``lost``);
    ``fields``: the record's other fields (``worker``, ``concurrency``, ``window``, ``injected``,
    ``extra``, ...)."""
    extra = {**fields.pop("extra", {}), "node": node_id, "lost_node": lost}
    return AttemptRecord(
        run_id=run_id, seq=seq, task=task, substrate=substrate, env=env, policy=policy,
        executor=RayExecutor.name, host=host, outcome=Outcome.INVALID, cause=InvalidCause.SUBSTRATE_FAILURE,
        reward=None, detail=f"ray node {node_name} on {host} {what}: {reason}"[:500],
        t_start=t_start, t_end=time.time(), extra=extra, **fields)


@dataclass
class RayExecutor:
    """Run a ``Job`` on a Ray cluster: ``concurrency`` attempts at once on each node.

    ``address``: ``None`` starts a single-node Ray of this process's own on loopback (stopped at
    the end); ``"auto"`` or ``HOST:PORT`` joins a running cluster. When this process is already
    connected to Ray (``ray.is_initialized()``, e.g. tests), that connection is used as is.
    ``on_control(fired, detail)`` receives each node's isolation positive control;
    ``on_event(line)`` receives one line per notable event (node lost, leftovers);
    ``on_ready(setup_s)`` is called once the nodes are connected and set up, before the first
    attempt (``setup_s``: the seconds that took; set-up is not work: the caller moves its deadline).
    ``live_sandboxes()``: the sandboxes the nodes held at their last report (polled about once a
    second while attempts run).
    """

    concurrency: int
    address: str | None = None
    on_control: Callable[[bool, str], None] | None = None
    on_event: Callable[[str], None] | None = None
    object_store_bytes: int = ray_env.OBJECT_STORE_BYTES
    runner_cls: type[NodeRunner] = NodeRunner  # the actor's body (``train`` runs its own subclass)
    on_ready: Callable[[float], None] | None = None
    name: str = field(default="ray", init=False)
    interrupted: bool = field(default=False, init=False)
    nodes: list[_Node] = field(default_factory=list, init=False)
    setup_s: float = field(default=0.0, init=False)
    _hub: Any = field(default=None, init=False)
    _live: dict[str, int] = field(default_factory=dict, init=False)  # node id -> sandboxes at its last report

    def live_sandboxes(self) -> int:
        return sum(self._live.values())

    # -- connection ----------------------------------------------------------------------------
    def _connect(self) -> tuple[Any, Callable[[], None]]:
        return connect(self.address, self.object_store_bytes)

    def _event(self, line: str) -> None:
        log.warning(line)
        if self.on_event is not None:
            self.on_event(line)
        else:
            print(f"ray: {line}", file=sys.stderr, flush=True)

    # -- the run -------------------------------------------------------------------------------
    def execute(self, job: Job, substrate: Substrate, sink: Callable[[AttemptRecord], None],
                tick: Callable[[], None] | None = None) -> None:
        ray, disconnect = self._connect()
        try:
            self._run(ray, job, substrate, sink, tick)
        finally:
            disconnect()

    def start_nodes(self, ray: Any, spec: RemoteJob) -> list[_Node]:
        """One ``runner_cls`` actor per alive node (or the session's first ``node_limit``), set up, its
        positive control reported; with two nodes or more, the cross-node control. ``UsageError``
        when no node can run attempts."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_cls = ray.remote(self.runner_cls)
        alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        sess = _SESSION.get()
        if sess is not None and sess.node_limit is not None:
            alive = alive[: sess.node_limit]
        if len(alive) >= 2:  # one registry for the cluster; a single node keeps its own (no extra calls)
            here = ray.get_runtime_context().get_node_id()
            self._hub = ray.remote(CanaryHub).options(num_cpus=0, max_restarts=0, scheduling_strategy=(
                NodeAffinitySchedulingStrategy(here, soft=False))).remote()
        nodes = []
        for i, node_id in enumerate(alive):
            actor = actor_cls.options(
                num_cpus=0, max_concurrency=self.concurrency + 3, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(spec, i, self.concurrency, node_id, self._hub)
            nodes.append(_Node(i, node_id, actor))
        infos = []
        setups = [node.actor.setup.remote() for node in nodes]  # all nodes at once
        for ref in setups:
            try:
                infos.append(ray.get(ref, timeout=300))
            except Exception as e:
                infos.append({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        ready = []
        for node, info in zip(nodes, infos, strict=True):
            problem = info.get("error") or info.get("missing")
            if problem:
                self._event(f"node {node.node_id[:8]} left out: {problem}")
                with contextlib.suppress(Exception):
                    ray.kill(node.actor)
                continue
            node.host, node.env = info["host"], info["env"]
            fired, detail = info["control"]
            if self.on_control is not None:
                self.on_control(fired, f"node {node.node_id[:8]} on {node.host}: {detail}")
            ready.append(node)
        if not ready:
            first = next((i.get("error") or i.get("missing") for i in infos), "the cluster has no alive node")
            raise UsageError(f"--executor ray: no node can run attempts: {first}")
        if len(ready) >= 2:
            self._cross_node_control(ray, ready[0], ready[1])
        return ready

    def _cross_node_control(self, ray: Any, a: _Node, b: _Node) -> None:
        """A canary of a sandbox on node ``a`` planted in a sandbox on node ``b`` must be caught on ``b``."""
        try:
            token = ray.get(a.actor.xcontrol_source.remote(), timeout=120)
            found, local = ray.get(b.actor.xcontrol_sink.remote(token), timeout=120)
            clean = ray.get(a.actor.xcontrol_finish.remote(), timeout=120)
            fired = bool(found and clean)
            detail = (f"cross-node leak node {a.node_id[:8]} -> node {b.node_id[:8]} detected: {found}; clean A "
                      f"reported clean: {clean}; a per-node registry would have caught it: {local}")
        except Exception as e:  # the control could not run: it did not fire
            fired, detail = False, f"cross-node control failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if self.on_control is not None:
            self.on_control(fired, detail)
        if not fired:
            self._event(detail)

    def _run(self, ray: Any, job: Job, substrate: Substrate, sink: Callable[[AttemptRecord], None],
             tick: Callable[[], None] | None) -> None:
        from ray.exceptions import RayActorError

        t0 = time.monotonic()
        spec = RemoteJob.of(job, substrate)
        self.nodes = self.start_nodes(ray, spec)
        self.setup_s = time.monotonic() - t0
        sess = _SESSION.get()
        if sess is not None:
            if job.deadline is not None and self.on_ready is None:  # a window's length is work after set-up
                job.deadline += self.setup_s
            sess.ready_at.append(time.time())
            sess.nodes_used.append([n.node_id for n in self.nodes])
        if self.on_ready is not None:
            self.on_ready(self.setup_s)
        policy_name = job.make_policy().name
        flights: dict[Any, _Flight] = {}
        stop_requested = threading.Event()
        polls: dict[Any, _Node] = {}  # live-sandbox reports asked for, not yet answered
        next_poll = [0.0]

        def poll_live() -> None:
            now = time.monotonic()
            if now < next_poll[0]:
                return
            next_poll[0] = now + 1.0
            if polls:
                done = ray.wait(list(polls), num_returns=len(polls), timeout=0)[0]
                for ref in done:
                    node = polls.pop(ref)
                    with contextlib.suppress(Exception):
                        self._live[node.node_id] = int(ray.get(ref))
            asked = {n.node_id for n in polls.values()}
            for node in self.nodes:
                if not node.lost and node.node_id not in asked:
                    polls[node.actor.live.remote()] = node

        def submit(node: _Node, k: int) -> None:
            if stop_requested.is_set() or node.lost:
                return
            work = job.next_work()
            if work is None:
                return
            ref = node.actor.attempt.remote(k, work.seq, work.task.id, work.fault)
            flights[ref] = _Flight(node, k, work, time.time())

        def lost_record(f: _Flight, reason: str, what: str = "lost mid-attempt") -> AttemptRecord:
            return lost_node_record(
                run_id=job.run_id, seq=f.work.seq, task=f.work.task.id, substrate=substrate.name, env=f.node.env,
                policy=policy_name, host=f.node.host, node_id=f.node.node_id, node_name=f.node.node_id[:8],
                what=what, reason=reason, t_start=f.t_submit, lost=what == "lost mid-attempt",
                worker=f.node.index * self.concurrency + f.slot, concurrency=self.concurrency,
                window=str(job.meta.get("window", "")), injected=f.work.fault)

        def lose(node: _Node, err: BaseException) -> None:
            node.lost = True
            self._live.pop(node.node_id, None)
            node.lost_reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
            mine = [ref for ref, f in flights.items() if f.node is node]
            for ref in mine:
                sink(lost_record(flights.pop(ref), node.lost_reason))
            live = sum(not n.lost for n in self.nodes)
            self._event(f"node {node.node_id[:8]} on {node.host} lost ({node.lost_reason}); {len(mine)} in-flight "
                        f"attempt(s) recorded invalid/substrate_failure; going on with {live} node(s)")
            with contextlib.suppress(Exception):
                ray.kill(node.actor, no_restart=True)

        def on_signal(signum: int, frame: Any) -> None:
            stop_requested.set()

        restore: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                restore[signum] = signal.signal(signum, on_signal)
        try:
            for node in self.nodes:
                for k in range(self.concurrency):
                    submit(node, k)
            while flights:
                if stop_requested.is_set():
                    self._interrupt(ray, job, flights)
                    break
                ready, rest = ray.wait(list(flights), num_returns=1, timeout=0.25)
                if ready and rest:  # and whatever else has finished meanwhile
                    ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
                if tick is not None:
                    tick()
                poll_live()
                for ref in ready:
                    f = flights.pop(ref, None)
                    if f is None:  # recorded already: its node was lost
                        continue
                    try:
                        rec = ray.get(ref)
                    except RayActorError as e:
                        flights[ref] = f  # lose() records it with the node's other in-flight attempts
                        lose(f.node, e)
                        continue
                    except Exception as e:  # the call itself failed (not the attempt): never a silent gap
                        rec = lost_record(f, f"{type(e).__name__}: {e}", what="remote call failed")
                    if stop_requested.is_set():
                        continue  # interrupted: dropped, as in process
                    sink(rec)
                    submit(f.node, f.slot)
            if stop_requested.is_set() and not self.interrupted:
                # The signal came after the loop's check and every in-flight attempt then finished
                # (dropped, none resubmitted): the loop ran dry, but the run was still interrupted.
                self._interrupt(ray, job, flights)
            if not stop_requested.is_set() and self.nodes and all(n.lost for n in self.nodes) \
                    and job.next_work() is not None:
                self.interrupted = True
                self._event("every node was lost; the run stopped early (resume it when the cluster is back)")
        finally:
            for signum, handler in restore.items():
                signal.signal(signum, handler)
            if polls:  # the last live-sandbox reports: answered or dropped before the actors go
                with contextlib.suppress(Exception):
                    ray.wait(list(polls), num_returns=len(polls), timeout=2)
                polls.clear()
            self.close_nodes(ray, job.run_id, substrate)
            if tick is not None:
                tick()

    def _interrupt(self, ray: Any, job: Job, flights: dict[Any, _Flight]) -> None:
        self.interrupted = True
        job.stop()
        stops = [n.actor.stop.remote() for n in self.nodes if not n.lost]
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=10)
        flights.clear()  # in-flight attempts were cut short by the operator: not recorded

    def close_nodes(self, ray: Any, run_id: str, substrate: Substrate) -> None:
        """Every live node destroys its sandboxes; then what is left is looked for once per host."""
        self._live.clear()
        live = [n for n in self.nodes if not n.lost]
        closing = [n.actor.close.remote() for n in live]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=60)
        here = socket.gethostname()
        if any(n.lost and n.host == here for n in self.nodes):
            # A lost node on this host could not clean up; every live node has closed, so what
            # remains of this run here is the lost node's.
            removed = type(substrate).gc(Path(substrate.state_dir), {run_id})
            if removed:
                self._event(f"removed what the lost node(s) left on {here}: {'; '.join(removed[:5])}")
        one_per_host = {n.host: n for n in live}
        checks = {n.actor.leftovers.remote(): n for n in one_per_host.values()}
        done, _ = ray.wait(list(checks), num_returns=len(checks), timeout=30) if checks else ([], [])
        for ref in done:
            with contextlib.suppress(Exception):
                left = ray.get(ref)
                if left:
                    self._event(f"left on {checks[ref].host}: {'; '.join(left[:5])}")
        for host in sorted({n.host for n in self.nodes if n.lost} - set(one_per_host) - {here}):
            self._event(f"the run's sandboxes on {host} may remain (its node was lost): run `drumsbench gc` there")
        for n in self.nodes:
            with contextlib.suppress(Exception):
                ray.kill(n.actor, no_restart=True)
        if self._hub is not None:
            with contextlib.suppress(Exception):
                ray.kill(self._hub, no_restart=True)
            self._hub = None
