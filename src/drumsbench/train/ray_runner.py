"""``drumsbench train --executor ray``: the training experiment's attempts run on a Ray cluster.

The learner (weights, updates, the ledger) stays in the driver; every attempt runs in a node's
``TrainNode`` actor (a ``NodeRunner`` of ``executors.ray``: one per alive node, pinned there, its
substrate, sandboxes, isolation positive control and the cluster's canary registry), ``concurrency``
attempts at once per node. A call carries the attempt's policy arguments (a numpy snapshot of the
weights, the task's action space, its sampling key and fault model); the node acts with a
``NetPolicy`` on its own slot and sends back the ``AttemptRecord`` with the policy's decisions.

The record keeps its outcome and cause exactly as ``run_attempt`` judged it on the node. A node
lost mid-attempt (``RayActorError``) makes each of its in-flight attempts ``invalid /
substrate_failure`` (``extra.lost_node``; no decisions, so none enters the loss), recorded by the
driver, and the batch goes on with the other nodes; every node lost is a ``SubstrateError``. Forked
group starts (``--start fork``) are not run on Ray (refused up front).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.outcome import InvalidCause
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import Task
from drumsbench.executors.base import Job
from drumsbench.executors.ray import NodeRunner, RayExecutor, RemoteJob, connect, lost_node_record
from drumsbench.ledger import Ledger
from drumsbench.policies.scripted import Null
from drumsbench.rollout.attempt import Slot, run_attempt
from drumsbench.rollout.faults import FaultPlan
from drumsbench.substrates.base import Substrate
from drumsbench.train.integrity import ForgeableCodingEnv
from drumsbench.train.policy_net import Decision, NetPolicy

if TYPE_CHECKING:
    from drumsbench.train.experiment import Parent, TrainConfig


class Acted:
    """What the learner needs of a policy that acted on a node: its decisions."""

    def __init__(self, decisions: list[Decision]) -> None:
        self.decisions = decisions


class TrainNode(NodeRunner):
    """One node's training attempts (the body of the Ray actor): slots of the honest environment,
    and of the forgeable one (integrity off) when asked."""

    def __init__(self, spec: RemoteJob, node_index: int, slots: int, node_id: str, hub: Any = None) -> None:
        super().__init__(spec, node_index, slots, node_id, hub)
        self.forgeable: dict[int, Slot] = {}

    def train_attempt(self, k: int, forgeable: bool, seq: int, task_id: str, fault: InvalidCause | None,
                      policy_args: dict[str, Any], meta: dict[str, Any]) -> tuple[AttemptRecord, list[Decision]]:
        if forgeable:
            if k not in self.forgeable:
                assert self.substrate is not None
                self.forgeable[k] = Slot(self.substrate, ForgeableCodingEnv(),
                                         worker=(self.node_index * self.slots_n + k) + 10_000)
            slot = self.forgeable[k]
        else:
            slot = self._slot(k)[0]
        spec = self.spec
        policy = NetPolicy(**policy_args, env=slot.env, step_timeout_s=spec.rollout.step_timeout_s)
        meta = {**meta, "host": self.host, "executor": RayExecutor.name,
                "extra": {**meta.get("extra", {}), "node": self.node_id}}
        rec = run_attempt(slot, spec.tasks[task_id], policy, spec.rollout, self.canaries, run_id=spec.run_id,
                          seq=seq, seed=0, fault=fault, meta=meta)
        return rec, policy.decisions

    def close(self) -> None:
        for slot in self.forgeable.values():
            try:
                slot.destroy()
            except Exception:  # best effort, as NodeRunner.close; leftovers() reports the rest
                continue
        super().close()


class RayRunner:
    """The ``_Runner`` of ``train.experiment`` on Ray: same ``batch``/``space``/``close`` contract."""

    def __init__(self, substrate: Substrate, suite: suites.Suite, cfg: TrainConfig, ledger: Ledger,
                 run_id: str) -> None:
        if "fork" in cfg.start:
            raise UsageError("--start fork: not with --executor ray (a group's parent and its forks share one "
                             "host); give --start scratch")
        self.cfg, self.ledger, self.run_id = cfg, ledger, run_id
        self.substrate, self.make_env = substrate, suite.make_env
        self.seq = ledger.next_seq(run_id)
        self.seg: int | None = None
        self.spaces: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=1)  # the experiment's fork path only (refused here)
        self.ray, self._disconnect = connect(cfg.ray_address)
        self.executor = RayExecutor(cfg.concurrency, cfg.ray_address, runner_cls=TrainNode, on_control=lambda f, d:
                                    ledger.record_control(run_id, "train", "isolation", f, d))
        job = Job(run_id=run_id, tasks=list(suite.tasks), make_policy=Null, make_env=suite.make_env,
                  rollout=cfg.rollout, faults=FaultPlan.parse("", seed=0), seed=0, first_seq=0, max_seq=0,
                  deadline=None, meta={})
        try:
            self.nodes = self.executor.start_nodes(self.ray, RemoteJob.of(job, substrate))
        except BaseException:
            self._disconnect()
            raise

    def space(self, task: Task) -> Any:
        from drumsbench.train.action_space import ActionSpace

        if task.id not in self.spaces:
            self.spaces[task.id] = ActionSpace.of(task)
        return self.spaces[task.id]

    def prepare(self, task: Task, forgeable: bool) -> Parent:
        raise UsageError("--start fork: not with --executor ray")

    def batch(self, items: Sequence[tuple[Task, dict[str, Any], InvalidCause | None, dict[str, Any]]],
              forgeable: bool = False, parents: dict[str, Parent] | None = None
              ) -> list[tuple[AttemptRecord, Acted]]:
        """Run the attempts on the cluster's nodes (``concurrency`` at a time on each); record each in
        the ledger in the order given; results in that order."""
        from ray.exceptions import RayActorError

        if parents is not None:
            raise UsageError("--start fork: not with --executor ray")
        ray, conc = self.ray, self.cfg.concurrency
        todo = deque(enumerate(items))
        seqs = list(range(self.seq, self.seq + len(items)))
        self.seq += len(items)
        results: list[tuple[AttemptRecord, Acted] | None] = [None] * len(items)
        free = deque((node, k) for k in range(conc) for node in self.nodes if not node.lost)
        flights: dict[Any, tuple[int, Any, int, float]] = {}
        while todo or flights:
            while todo and free:
                node, k = free.popleft()
                if node.lost:
                    continue
                i, (task, args, fault, meta) = todo.popleft()
                ref = node.actor.train_attempt.remote(k, forgeable, seqs[i], task.id, fault, args, meta)
                flights[ref] = (i, node, k, time.time())
            if not flights:
                raise SubstrateError("every Ray node was lost; the training run cannot go on")
            ready, _ = ray.wait(list(flights), num_returns=1)
            for ref in ready:
                if ref not in flights:
                    continue
                i, node, k, _t0 = flights[ref]
                try:
                    rec, decisions = ray.get(ref)
                except RayActorError as e:
                    node.lost = True
                    reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
                    for other in [r for r, f in flights.items() if f[1] is node]:
                        j, _, slot_k, t_start = flights.pop(other)
                        results[j] = (self._lost(items[j], seqs[j], node, slot_k, t_start, reason), Acted([]))
                    self.executor._event(f"node {node.node_id[:8]} on {node.host} lost ({reason}); its in-flight "
                                         f"attempts recorded invalid/substrate_failure")
                    continue
                del flights[ref]
                results[i] = (rec, Acted(decisions))
                free.append((node, k))
        out = [r for r in results if r is not None]
        for rec, _ in out:
            self.ledger.record(rec, self.seg)
        return out

    def _lost(self, item: tuple[Task, dict[str, Any], InvalidCause | None, dict[str, Any]], seq: int, node: Any,
              k: int, t_start: float, reason: str) -> AttemptRecord:
        task, _args, fault, meta = item
        return lost_node_record(
            run_id=self.run_id, seq=seq, task=task.id, substrate=self.substrate.name, env=node.env,
            policy=NetPolicy.name, host=node.host or socket.gethostname(), node_id=node.node_id,
            node_name=node.node_id[:8], what="lost mid-attempt", reason=reason, t_start=t_start,
            worker=node.index * self.cfg.concurrency + k, concurrency=self.cfg.concurrency,
            window=str(meta.get("window", "")), injected=fault, extra=dict(meta.get("extra", {})))

    def close(self) -> None:
        try:
            self.pool.shutdown(wait=True)
            self.executor.close_nodes(self.ray, self.run_id, self.substrate)
        finally:
            self._disconnect()
