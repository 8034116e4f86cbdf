"""``drumsbench branch``: fork many continuations from one prepared live state and judge each method.

1. Prepare: a parent sandbox, the task's verified reset, then k actions (``Task.branch_prefix``);
   the prepared state is ``Environment.capture()``.
2. Fork M continuations with each method, one at a time (creation time each), then M at once
   (creation time in parallel).
3. Faithfulness of every continuation, dimension by dimension, against the prepared state.
4. Continue every sequential continuation to the end with the continuation policy (noisy by
   default, so they differ), verify it and record it in the ledger as an attempt with its fork
   method, k and parent — an unfaithful one is invalid (``dirty_reset``) and never used.
5. Per method: creation p50/p95 one at a time and in parallel, faithful share per dimension, valid
   continuations per host-hour, USD per valid continuation; creation time against k.

The parent's prepared state is captured again at the end: forks must not have changed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from drumsbench.branching.methods import METHODS, ForkMethod, timed_fork
from drumsbench.core.errors import UsageError
from drumsbench.envs import suites
from drumsbench.envs.base import Action, Task
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import BranchMethodArtifact, BranchSummaryArtifact, latency, share
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
    parent.provision()
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


def _fork_parallel(method: ForkMethod, n: int, generation: int) -> tuple[list[float], float, list[str]]:
    """n forks at once: (creation time of each, wall time of all, errors). Destroys them all."""
    times: list[float] = []
    made: list[Slot] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            slot, took = timed_fork(method, generation)
            with lock:
                made.append(slot)
                times.append(took)
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
        self.faithful: dict[str, list[bool]] = {}
        self.valid_times: list[float] = []
        self.valid = self.success = 0
        self.invalid: dict[str, int] = {}
        self.errors: list[str] = []
        self.span = 0.0
        self.screen: str | None = None  # the first continuation's screen (base64 PNG), desktop only


def run_branch(cfg: BranchConfig, substrate: Substrate, ledger: Ledger, run_id: str,
               say: Callable[[str], None] = lambda _m: None) -> BranchReport:
    suite = suites.load(cfg.tasks)
    task = _pick(list(suite.tasks), cfg.task)
    for name in cfg.methods:
        METHODS.load(name)  # a one-line error naming the known methods
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
                child, took = timed_fork(method, parent.env.generation)
            except Exception as e:  # a failed fork is a result of the method
                out.errors.append(f"fork {i}: {type(e).__name__}: {e}"[:300])
                continue
            out.times.append(took)
            try:
                now = child.env.capture()
                if out.screen is None and isinstance(now.get("screen"), str):
                    out.screen = now["screen"]
                dims = parent.env.compare(prepared, now)
                for dim, same in dims.items():
                    out.faithful.setdefault(dim, []).append(same)
                rec = run_attempt(child, task, _continuation_policy(cfg), cfg.rollout, canaries,
                                  run_id=run_id, seq=next_seq[0], seed=cfg.seed, prepared=prepared,
                                  meta={"window": f"{name}/k={cfg.k}",
                                        "extra": {"fork_method": name, "k": cfg.k, "parent": parent.env.box.id,
                                                  "creation_s": took, "faithful": dims}})
                next_seq[0] += 1
                ledger.record(rec, seg)
                if rec.cause is None:
                    out.valid += 1
                    out.success += rec.outcome.value == "success"
                    out.valid_times.append(time.monotonic() - start)
                else:
                    out.invalid[rec.cause.value] = out.invalid.get(rec.cause.value, 0) + 1
            finally:
                child.destroy()
        out.span = time.monotonic() - start
        return out

    results: list[MethodResult] = []
    try:
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
                par_times, wall, par_errors = _fork_parallel(method, cfg.continuations, parent.env.generation)
            finally:
                method.close()
            by_k = {}
            for k in cfg.ks:
                say(f"{name}: creation time at k={k}")
                by_k[str(k)] = quantile(seq.times, 0.5) if k == cfg.k else \
                    _creation_at(name, k, substrate, suite, task, cfg)
            every = [all(v[i] for v in seq.faithful.values()) for i in range(len(seq.times))] if seq.faithful else []
            throughput = rate_per_hour(seq.valid_times, seq.span)
            results.append(MethodResult(
                method=name, env=suite.kind, task=task.id, k=cfg.k, prepare_s=prepare_s,
                creation_sequential=latency(seq.times), creation_parallel=latency(par_times), parallel_wall_s=wall,
                faithful={d: share(v) for d, v in seq.faithful.items()}, faithful_all=share(every),
                continuations=len(seq.times),
                valid=seq.valid, success=seq.success, invalid=seq.invalid, valid_per_host_hour=throughput,
                usd_per_valid_continuation=usd_per_valid_rollout(cfg.price, throughput),
                creation_by_k=by_k, errors=seq.errors + par_errors))
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
        prepared_unchanged=all(unchanged.values()), isolation_control_fired=control.fired, methods=results,
        price=cfg.price,
        conditions=f"{substrate.name} substrate, task {task.id}, k={cfg.k}, {cfg.continuations} continuations per "
                   f"method, continuation policy {cfg.policy}; 95% intervals")
    artifacts.put(ledger, run_id, "report", report)
    return report
