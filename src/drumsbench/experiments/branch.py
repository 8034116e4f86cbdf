"""``drumsbench branch``: fork many continuations from one prepared live state and judge each method.

1. Prepare: a parent sandbox, the task's verified reset, then k actions (``Task.branch_prefix``);
   the prepared state is ``Environment.capture()``.
2. Fork M continuations with each method, one at a time, then M at once. Per fork: creation, the
   cost of making it wherever it was paid (``ForkMethod.fork_cost``: a pool's restore made ahead
   of demand counts its own phases), and the hand-over, what the caller of ``fork`` waited.
3. Faithfulness of every continuation, dimension by dimension, against the prepared state (the
   check's own time, ``capture()`` + ``compare``, is kept per continuation).
4. Continue every sequential continuation to the end with the continuation policy (noisy by
   default, so they differ), verify it and record it in the ledger as an attempt with its fork
   method, k and parent — an unfaithful one is invalid (``dirty_reset``) and never used.
5. Per method: creation p50/p95 one at a time and in parallel, the hand-over apart, faithful share
   per dimension, valid continuations per host-hour, USD per valid continuation; creation time
   against k. Against ``replay``: valid continuations per host-hour end to end beside the creation
   cost, both as ratios with intervals (``BranchRatio``).

The parent's prepared state is captured again at the end: forks must not have changed it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from drumsbench.branching.methods import METHODS, ForkCost, ForkMethod, costed_fork, fork_parallel, timed_fork
from drumsbench.core.errors import UsageError
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import Action, Task
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import (
    BranchMethodArtifact,
    BranchNode,
    BranchSummaryArtifact,
    branch_ratios,
    latency,
    share,
)
from drumsbench.measure.cost import DEFAULT_PRICE, HostPrice, usd_per_valid_rollout
from drumsbench.measure.stats import Estimate, quantile, rate_per_hour
from drumsbench.policies.scripted import Continue, Policy, make_policy
from drumsbench.rollout import gates
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, positive_control
from drumsbench.substrates.base import Substrate


class BranchConfig(BaseModel):
    tasks: str = "coding"
    task: str | None = None
    substrate: str = "process"
    k: int = Field(5, ge=0, le=200)
    ks: list[int] = Field(default_factory=lambda: [1, 5, 20])
    continuations: int = Field(16, ge=1, le=256)
    methods: list[str] = Field(default_factory=lambda: ["replay", "file"])
    policy: str = "noisy"
    noisy_p: float = Field(0.5, ge=0, le=1)
    growth_forks: int = Field(3, ge=1, le=32)
    seed: int = 0
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(step_timeout_s=30, episode_timeout_s=300))
    price: HostPrice = DEFAULT_PRICE
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # with ray: join this cluster (None: a loopback Ray of the run's own)


MethodResult = BranchMethodArtifact  # the typed artifact is the result (measure/artifacts.py)
BranchReport = BranchSummaryArtifact


def _pick(tasks: list[Task], task_id: str | None) -> Task:
    if task_id is None:
        return tasks[0]
    for t in tasks:
        if t.id == task_id:
            return t
    raise UsageError(f"--task: no task {task_id!r} in the suite; `drumsbench tasks list` shows them")


def _prepare_parent(substrate: Substrate, suite: suites.Suite, task: Task, k: int, cfg: BranchConfig) -> Slot:
    parent = Slot(substrate, suite.make_env())
    for name in cfg.methods:
        METHODS[name].configure_parent(parent.env)
    parent.provision(task)
    parent.env.reset(task)
    gates.check_reset(parent.env, task)
    for spec in task.branch_prefix(k):
        obs = parent.env.step(Action.of(spec, parent.env.generation), cfg.rollout.step_timeout_s)
        gates.check_observation(parent.env, obs)
    return parent


def _continuation_policy(cfg: BranchConfig) -> Policy:
    """The policy that carries a continuation on from the branch point (never from the task's start)."""
    p = {"oracle": 1.0, "null": None, "noisy": cfg.noisy_p}.get(cfg.policy, cfg.noisy_p)
    return make_policy("null") if p is None else Continue(cfg.k, p)


def _creation_at(name: str, k: int, substrate: Substrate, suite: suites.Suite, task: Task,
                 cfg: BranchConfig) -> Estimate:
    """Median creation time of a few forks made after k actions."""
    parent = _prepare_parent(substrate, suite, task, k, cfg)
    try:
        method = METHODS[name](substrate, suite.make_env, task, task.branch_prefix(k), cfg.rollout.step_timeout_s)
        method.prepare(parent)
        try:
            times = []
            for _ in range(cfg.growth_forks):
                slot, took = timed_fork(method, parent.env.generation)
                times.append(took)
                slot.destroy()
        finally:
            method.close()
        return quantile(times, 0.5)
    finally:
        parent.destroy()


class _Sequential:
    """Continuations one at a time, each checked for faithfulness, run to the end and recorded."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.costs: list[ForkCost] = []  # local forks: creation, hand-over, made ahead or not
        self.checks: list[float] = []  # capture() + compare per continuation
        self.faithful: dict[str, list[bool]] = {}
        self.valid_times: list[float] = []
        self.valid = self.success = 0
        self.invalid: dict[str, int] = {}
        self.errors: list[str] = []
        self.span = 0.0
        self.screen: str | None = None  # the first continuation's screen (base64 PNG), desktop only

    def add_fork(self, took: float, dims: dict[str, bool]) -> None:
        self.times.append(took)
        for dim, same in dims.items():
            self.faithful.setdefault(dim, []).append(same)

    def count(self, rec: AttemptRecord, at: float) -> None:
        """A recorded continuation's outcome; ``at`` = seconds since the continuations began."""
        if rec.cause is None:
            self.valid += 1
            self.success += rec.outcome.value == "success"
            self.valid_times.append(at)
        else:
            self.invalid[rec.cause.value] = self.invalid.get(rec.cause.value, 0) + 1

    def every(self) -> list[bool]:
        """Per continuation: faithful on every dimension."""
        return [all(v[i] for v in self.faithful.values()) for i in range(len(self.times))] if self.faithful else []


def run_branch(cfg: BranchConfig, substrate: Substrate, ledger: Ledger, run_id: str,
               say: Callable[[str], None] = lambda _m: None) -> BranchReport:
    suite = suites.load(cfg.tasks)
    task = _pick(list(suite.tasks), cfg.task)
    for name in cfg.methods:
        METHODS.load(name)  # a one-line error naming the known methods
    ray_problems(cfg, type(substrate))
    method_problems(cfg, type(substrate), suite.make_env)
    canaries = CanaryRegistry()
    control = positive_control(substrate)
    ledger.record_control(run_id, "branch", "isolation", control.fired, control.detail)
    seg = ledger.start_segment(run_id, 0, "branch")
    next_seq = [ledger.next_seq(run_id)]

    say(f"prepare: {task.id}, k={cfg.k}")
    parent = _prepare_parent(substrate, suite, task, cfg.k, cfg)
    prepared = parent.env.capture()
    if isinstance(prepared.get("screen"), str):
        artifacts.put(ledger, run_id, f"{task.id}/prepared/prepared", artifacts.ScreenshotArtifact(
            task=task.id, stage="prepared", png_base64=prepared["screen"], note=f"the prepared state, k={cfg.k}"))

    def continue_all(name: str, method: ForkMethod) -> _Sequential:
        out = _Sequential()
        start = time.monotonic()
        for i in range(cfg.continuations):
            try:
                child, cost = costed_fork(method, parent.env.generation)
            except Exception as e:  # a failed fork is a result of the method
                out.errors.append(f"fork {i}: {type(e).__name__}: {e}"[:300])
                continue
            took = cost.creation_s
            try:
                t0 = time.monotonic()
                now = child.env.capture()
                dims = parent.env.compare(prepared, now)
                out.checks.append(time.monotonic() - t0)
                if out.screen is None and isinstance(now.get("screen"), str):
                    out.screen = now["screen"]
                out.costs.append(cost)
                out.add_fork(took, dims)
                rec = run_attempt(child, task, _continuation_policy(cfg), cfg.rollout, canaries,
                                  run_id=run_id, seq=next_seq[0], seed=cfg.seed, prepared=prepared,
                                  meta={"window": f"{name}/k={cfg.k}",
                                        "extra": {"fork_method": name, "k": cfg.k, "parent": parent.env.box.id,
                                                  "creation_s": took, "handover_s": cost.handover_s,
                                                  "made_ahead": cost.ahead, "faithful": dims}})
                next_seq[0] += 1
                ledger.record(rec, seg)
                out.count(rec, time.monotonic() - start)
            finally:
                child.destroy()
        out.span = time.monotonic() - start
        return out

    results: list[MethodResult] = []
    controls = [control.fired]
    try:
        if cfg.executor == "ray":
            results = _on_ray(cfg, substrate, ledger, run_id, seg, task, parent, prepared, next_seq, controls, say)
        else:
            for name in cfg.methods:
                method: ForkMethod = METHODS[name](substrate, suite.make_env, task, task.branch_prefix(cfg.k),
                                                   cfg.rollout.step_timeout_s)
                t0 = time.monotonic()
                method.prepare(parent)
                prepare_s = time.monotonic() - t0
                try:
                    say(f"{name}: {cfg.continuations} continuations, one at a time, each run to the end")
                    seq = continue_all(name, method)
                    say(f"{name}: {cfg.continuations} continuations at once")
                    par_costs: list[ForkCost] = []
                    par_times, wall, par_errors = fork_parallel(method, cfg.continuations, parent.env.generation,
                                                                par_costs)
                finally:
                    method.close()
                by_k = {}
                for k in cfg.ks:
                    say(f"{name}: creation time at k={k}")
                    by_k[str(k)] = quantile(seq.times, 0.5) if k == cfg.k else \
                        _creation_at(name, k, substrate, suite, task, cfg)
                every = seq.every()
                throughput = rate_per_hour(seq.valid_times, seq.span)
                results.append(MethodResult(
                    method=name, env=suite.kind, task=task.id, k=cfg.k, prepare_s=prepare_s,
                    creation_sequential=latency(seq.times), creation_parallel=latency(par_times), parallel_wall_s=wall,
                    faithful={d: share(v) for d, v in seq.faithful.items()}, faithful_all=share(every),
                    continuations=len(seq.times),
                    valid=seq.valid, success=seq.success, invalid=seq.invalid, valid_per_host_hour=throughput,
                    usd_per_valid_continuation=usd_per_valid_rollout(cfg.price, throughput),
                    creation_by_k=by_k, errors=seq.errors + par_errors,
                    handover_sequential=latency([c.handover_s for c in seq.costs]),
                    handover_parallel=latency([c.handover_s for c in par_costs]),
                    made_ahead=sum(c.ahead for c in seq.costs), made_ahead_parallel=sum(c.ahead for c in par_costs),
                    creation_phases=_phases(seq.costs), capture=latency(seq.checks), span_s=seq.span,
                    valid_times_s=seq.valid_times))
                artifacts.put(ledger, run_id, name, results[-1])
                if seq.screen is not None:
                    artifacts.put(ledger, run_id, f"{task.id}/{name}/continuation", artifacts.ScreenshotArtifact(
                        task=task.id, stage="continuation", method=name, png_base64=seq.screen,
                        note=f"{name}: the first continuation as forked, before it went on"))
        unchanged = parent.env.compare(prepared, parent.env.capture())
    finally:
        parent.destroy()
        ledger.heartbeat(run_id, seg)
    report = BranchReport(
        run_id=run_id, task=task.id, env=suite.kind, substrate=substrate.name, k=cfg.k, prepared=prepared,
        prepared_unchanged=all(unchanged.values()), isolation_control_fired=all(controls), methods=results,
        price=cfg.price, executor=cfg.executor, ratios=branch_ratios(results),
        conditions=f"{substrate.name} substrate, task {task.id}, k={cfg.k}, {cfg.continuations} continuations per "
                   f"method, continuation policy {cfg.policy}{_ray_conditions(results)}; 95% intervals")
    artifacts.put(ledger, run_id, "report", report)
    return report


def _phases(costs: list[ForkCost]) -> dict[str, Estimate]:
    """Median of each phase a method reported (seconds), over the continuations that have it (the
    caller's wait apart: that is the hand-over)."""
    keys = list(dict.fromkeys(k for c in costs for k in c.phases if k.endswith("_s") and k != "wait_s"))
    return {k: quantile([c.phases[k] for c in costs if k in c.phases], 0.5) for k in keys}


def method_problems(cfg: BranchConfig, substrate_cls: type[Substrate], make_env: object) -> None:
    """``UsageError`` (one line) for a method this substrate or the suite's environment cannot run
    (``ForkMethod.unmet``), before anything is prepared; ``make_env`` is the suite's."""
    env_cls = make_env if isinstance(make_env, type) else None
    for name in cfg.methods:
        problem = METHODS[name].unmet(substrate_cls, env_cls)
        if problem:
            raise UsageError(f"--methods {name}: {problem}")


def ray_problems(cfg: BranchConfig, substrate_cls: type[Substrate]) -> None:
    """``UsageError`` (one line) for what ``--executor ray`` cannot do yet; nothing for local runs."""
    from drumsbench.branching.methods import ship_problem, shippable

    if cfg.executor != "ray":
        if cfg.ray_address is not None:
            raise UsageError("--ray-address: only with --executor ray")
        return
    for name in cfg.methods:
        if not shippable(name):
            ok = ", ".join(n for n in METHODS.names() if shippable(n))
            raise UsageError(f"--methods {name}: cannot ship its prepared state to Ray nodes yet; with --executor "
                             f"ray use {ok}")
        problem = ship_problem(name, substrate_cls)
        if problem is not None:
            raise UsageError(f"--methods {name}: {problem}")
    if any(k != cfg.k for k in cfg.ks):
        raise UsageError(f"--ks: with --executor ray only the branch point is measured; give --ks {cfg.k} or "
                         "leave --ks out")


def _ray_conditions(results: list[MethodResult]) -> str:
    nodes = sorted({n.label for m in results for n in m.nodes})
    if not nodes:
        return ""
    hosts = sorted({n.host for m in results for n in m.nodes})
    return (f", on Ray nodes {', '.join(nodes)} ({len(hosts)} host(s)): creation on the node that ran the "
            "continuation, the prepared state's transfer to it apart; one at a time per node, nodes at once")


def _on_ray(cfg: BranchConfig, substrate: Substrate, ledger: Ledger, run_id: str, seg: int, task: Task,
            parent: Slot, prepared: dict[str, object], next_seq: list[int], controls: list[bool],
            say: Callable[[str], None]) -> list[MethodResult]:
    """Every method on the Ray cluster (``executors.ray_branch``): the prepared state packed here,
    shipped through the object store, continuations made, checked and run on the nodes."""
    from drumsbench.branching.methods import Shippable
    from drumsbench.executors.ray_branch import BranchCluster, BranchSpec, Continued

    suite = suites.load(cfg.tasks)
    box = parent.sandbox
    assert box is not None
    spec = BranchSpec(run_id=run_id, task=task, make_env=suite.make_env, policy=_continuation_policy(cfg),
                      rollout=cfg.rollout, seed=cfg.seed, k=cfg.k, prepared=dict(prepared), parent=box.id,
                      substrate_cls=type(substrate), driver_host=socket.gethostname(),
                      driver_state_dir=str(substrate.state_dir), env_kind=suite.kind)
    results: list[MethodResult] = []
    say("ray: starting one branch actor per node")
    with BranchCluster(cfg.ray_address, spec, say) as cluster:
        for fired, detail in cluster.controls:
            ledger.record_control(run_id, "branch", "isolation", fired, detail)
            controls.append(fired)
        labels = {n.node_id: n for n in cluster.nodes}
        for name in cfg.methods:
            method = METHODS[name](substrate, suite.make_env, task, task.branch_prefix(cfg.k),
                                   cfg.rollout.step_timeout_s)
            if not isinstance(method, Shippable):
                raise UsageError(f"--methods {name}: cannot ship its prepared state to Ray nodes yet")
            t0 = time.monotonic()
            method.prepare_to_ship(parent)
            t1 = time.monotonic()
            try:
                data = method.pack()
            finally:
                method.close()
            t2 = time.monotonic()
            say(f"{name}: shipping {len(data)} bytes to {len(cluster.live())} node(s)")
            shipped, errors = cluster.ship(name, data)
            seqs = list(range(next_seq[0], next_seq[0] + cfg.continuations))
            next_seq[0] += cfg.continuations
            out = _Sequential()
            by_node: dict[str, list[Continued]] = {}
            start = time.monotonic()

            def record(c: Continued, out: _Sequential = out, by_node: dict[str, list[Continued]] = by_node,
                       start: float = start) -> None:
                if c.record is not None and c.creation_s is None:  # its node was lost: the driver's record
                    ledger.record(c.record, seg)
                    out.count(c.record, time.monotonic() - start)
                    return
                if c.record is None or c.creation_s is None:
                    out.errors.append(c.error or f"continuation {c.seq}: no record")
                    return
                out.add_fork(c.creation_s, c.faithful)
                by_node.setdefault(c.node_id, []).append(c)
                ledger.record(c.record, seg)
                out.count(c.record, time.monotonic() - start)

            say(f"{name}: {cfg.continuations} continuations over {len(cluster.live())} node(s), each run to the end")
            errors += cluster.continuations(name, seqs, parent.env.generation, f"{name}/k={cfg.k}", record)
            out.span = time.monotonic() - start
            say(f"{name}: {cfg.continuations} continuations at once")
            par_times, wall, par_errors = cluster.parallel(name, cfg.continuations, parent.env.generation)
            cluster.drop(name)
            hosts = max(1, len({n.host for n in cluster.nodes}))
            throughput = per_host(rate_per_hour(out.valid_times, out.span), hosts)
            nodes = []
            for node_id, (transfer_s, unpack_s) in shipped.per_node.items():
                mine = by_node.get(node_id, [])
                flags = [all(c.faithful.values()) and bool(c.faithful) for c in mine]
                nodes.append(BranchNode(
                    node_id=node_id, label=labels[node_id].label, host=labels[node_id].host, transfer_s=transfer_s,
                    unpack_s=unpack_s, continuations=len(mine), faithful_all=share(flags),
                    creation_sequential=latency([c.creation_s or 0.0 for c in mine]), seqs=[c.seq for c in mine]))
            results.append(MethodResult(
                method=name, env=suite.kind, task=task.id, k=cfg.k, prepare_s=t1 - t0,
                creation_sequential=latency(out.times), creation_parallel=latency(par_times), parallel_wall_s=wall,
                faithful={d: share(v) for d, v in out.faithful.items()}, faithful_all=share(out.every()),
                continuations=len(out.times), valid=out.valid, success=out.success, invalid=out.invalid,
                valid_per_host_hour=throughput, usd_per_valid_continuation=usd_per_valid_rollout(cfg.price, throughput),
                creation_by_k={str(cfg.k): quantile(out.times, 0.5)}, errors=out.errors + errors + par_errors,
                executor="ray", shipped_bytes=shipped.bytes, pack_s=t2 - t1, put_s=shipped.put_s, nodes=nodes,
                span_s=out.span, valid_times_s=out.valid_times))
            artifacts.put(ledger, run_id, name, results[-1])
    for line in cluster.leftovers:
        say(f"ray: left on a node: {line}")
    if cluster.leftovers:
        controls.append(False)  # never a clean report over what a node left behind
    return results


def per_host(rate: Estimate, hosts: int) -> Estimate:
    """A cluster's rate per host (host-hours = hosts x hours)."""
    if hosts == 1 or rate.value is None:
        return rate
    return Estimate(value=rate.value / hosts, low=None if rate.low is None else rate.low / hosts,
                    high=None if rate.high is None else rate.high / hosts, n=rate.n,
                    method=f"{rate.method}, / {hosts} hosts")
