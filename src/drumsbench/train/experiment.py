"""The training loop of ``drumsbench train``: treatments x seeds, each a GRPO run through the real
rollout engine (``rollout.run_attempt``: the gates, the substrate, the verifier), every attempt in
the ledger.

Per (treatment, seed), from the same initial weights (seeded) and the same fault draws:

1. evaluate (clean: no injected faults) on the eval tasks;
2. for each iteration: draw ``groups`` tasks (from the seed and the iteration alone), run
   ``group_size`` attempts of each from the task's verified start state, each acting from the
   same weights; ``retry`` re-samples invalid members (new draws, the cost counted);
3. group advantages by the treatment's rule, one clipped policy-gradient update;
4. evaluate every ``eval_every`` iterations (``eval_episodes`` sampled episodes per eval task) and
   after the last (``final_eval_episodes``).

Ledger: run kind ``train``; each attempt's ``window`` is ``TREATMENT/sSEED`` and its ``extra.train``
holds phase, treatment, seed, iteration, group, member and retry; the batch of every update
(artifact ``train-batch``: which attempts entered the loss, with their advantages) and the policy at
each eval point (artifact ``train-policy``: first-step probabilities) are stored too. One segment
per (treatment, seed) gives the host time. ``rebuild.build_report`` makes the report from these
alone.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, Field, model_validator

from drumsbench.branching.methods import FileCopy, costed_fork
from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import InvalidCause
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import Action, Task
from drumsbench.ledger import Ledger
from drumsbench.measure.cost import DEFAULT_PRICE, HostPrice
from drumsbench.rollout import gates
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, positive_control
from drumsbench.substrates.base import Substrate
from drumsbench.train.action_space import GOLDEN_SLOT, SABOTAGE_SLOTS, SLOTS, ActionSpace
from drumsbench.train.fault_model import FaultMode, FaultModel
from drumsbench.train.grpo import Sample
from drumsbench.train.integrity import ForgeableCodingEnv
from drumsbench.train.policy_net import Decision, NetPolicy, Snapshot

if TYPE_CHECKING:
    from drumsbench.train.ray_runner import RayRunner
from drumsbench.train.treatments import Treatment, group_advantages

RUN_KIND = "train"
PREFIX = ("read", "test")


def _integrity_on() -> list[Literal["on", "off"]]:
    return ["on"]


def _scratch() -> list[Literal["scratch", "fork"]]:
    return ["scratch"]


class TrainConfig(BaseModel):
    """Everything a training experiment depends on (stored as the run's configuration)."""

    tasks: str = "coding"
    substrate: str = "process"
    treatments: list[Treatment] = Field(default_factory=lambda: [Treatment.EXCLUDE, Treatment.ZERO])
    seeds: list[int] = Field(default_factory=lambda: [0])
    fault_mode: FaultMode = FaultMode.CORRELATED
    fault_scale: float = Field(1.0, ge=0.0, le=10.0)
    only: list[str] = Field(default_factory=list, description="task ids to use (empty: the whole suite)")
    integrity: list[Literal["on", "off"]] = Field(
        default_factory=_integrity_on, description="verifier integrity per arm; off only for the integrity "
                                                    "contrast (train.integrity), evaluation always on")
    iterations: int = Field(8, ge=1, le=10_000)
    groups: int = Field(4, ge=1, le=256)
    group_size: int = Field(4, ge=2, le=256)
    eval_every: int = Field(2, ge=1)
    eval_episodes: int = Field(1, ge=1, le=100)
    final_eval_episodes: int = Field(3, ge=1, le=100)
    holdout_every: int = Field(3, ge=0, description="every n-th task of the suite is held out for evaluation "
                                                     "(0: evaluate on the training tasks)")
    start: list[Literal["scratch", "fork"]] = Field(
        default_factory=_scratch, description="how group members start: scratch (each its own verified reset and "
                                              "prefix) or fork (one parent per group prepared once, members "
                                              "forked from it with the file-copy fork method)")
    prefix_k: int = Field(0, ge=0, le=2, description="prefix actions before the policy decides: read, then test")
    max_actions: int = Field(3, ge=1, le=20)
    max_retries: int = Field(3, ge=1, le=20)
    lr: float = Field(0.05, gt=0)
    clip: float = Field(0.2, gt=0, lt=1)
    epochs: int = Field(4, ge=1, le=100)
    concurrency: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=64)  # per node with Ray
    executor: Literal["local", "ray"] = "local"  # ray: attempts on a Ray cluster's nodes (train.ray_runner)
    ray_address: str | None = None  # None: a local single-node Ray of the run's own
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(step_timeout_s=1.0, episode_timeout_s=30.0,
                                                                         max_steps=50))
    price: HostPrice = DEFAULT_PRICE

    @model_validator(mode="after")
    def _checked(self) -> TrainConfig:
        if not self.treatments:
            raise UsageError("--treatments: give at least one")
        if not self.seeds:
            raise UsageError("--seeds: give at least one seed")
        if not self.integrity or len(set(self.integrity)) != len(self.integrity):
            raise UsageError("--integrity: give on, off or on,off")
        if not self.start or len(set(self.start)) != len(self.start):
            raise UsageError("--start: give scratch, fork or scratch,fork")
        if self.executor == "ray" and "fork" in self.start:
            raise UsageError("--start fork: not with --executor ray (a group's parent and its forks share one "
                             "host); give --start scratch")
        return self

    def arms(self) -> list[Arm]:
        """Integrity x start x treatment, in that nesting order."""
        return [Arm(t, i == "on", st == "fork") for i in self.integrity for st in self.start for t in self.treatments]

    def prefix(self) -> tuple[int, ...]:
        return tuple(SLOTS.index(name) for name in PREFIX[: self.prefix_k])


@dataclass(frozen=True)
class Arm:
    """One line of the experiment: a treatment of invalid attempts, with verifier integrity on or off."""

    treatment: Treatment
    integrity: bool = True
    fork: bool = False

    @property
    def label(self) -> str:
        return self.treatment.value + ("" if self.integrity else "+integrity-off") + ("+fork" if self.fork else "")


@dataclass(frozen=True)
class Split:
    train: list[Task]
    eval: list[Task]


def split_tasks(tasks: list[Task], holdout_every: int) -> Split:
    """Every ``holdout_every``-th task (by id order) is evaluation only; the rest train."""
    if holdout_every <= 1:
        return Split(list(tasks), list(tasks))
    held = [t for i, t in enumerate(tasks) if i % holdout_every == holdout_every - 1]
    train = [t for t in tasks if t not in held]
    if not train or not held:
        return Split(list(tasks), list(tasks))
    return Split(train, held)


@dataclass
class Progress:
    """Where the experiment is: updates done of the total, and what runs now."""

    done: int = 0
    total: int = 0
    label: str = ""
    attempts: int = 0
    invalid: int = 0


@dataclass
class Parent:
    """A group's prepared state and the fork method that continues it."""

    slot: Slot
    method: FileCopy
    prepared: dict[str, Any]
    generation: int
    last_exit: int | None
    box_id: str


class _Runner:
    """Runs attempts on ``concurrency`` slots (one sandbox each, reused with a verified reset)."""

    def __init__(self, substrate: Substrate, suite: suites.Suite, cfg: TrainConfig, ledger: Ledger,
                 run_id: str) -> None:
        self.cfg, self.ledger, self.run_id = cfg, ledger, run_id
        self.substrate, self.make_env = substrate, suite.make_env
        self.slots: queue.Queue[Slot] = queue.Queue()
        self.forgeable: queue.Queue[Slot] = queue.Queue()
        for w in range(cfg.concurrency):
            self.slots.put(Slot(substrate, suite.make_env(), worker=w))
            if "off" in cfg.integrity:
                self.forgeable.put(Slot(substrate, ForgeableCodingEnv(), worker=cfg.concurrency + w))
        self.pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="drumsbench-train")
        self.canaries = CanaryRegistry()
        self.seq = ledger.next_seq(run_id)
        self.seg: int | None = None
        self.spaces: dict[str, ActionSpace] = {}
        self.lock = threading.Lock()

    def space(self, task: Task) -> ActionSpace:
        if task.id not in self.spaces:
            self.spaces[task.id] = ActionSpace.of(task)
        return self.spaces[task.id]

    def _one(self, task: Task, policy_args: dict[str, Any], fault: InvalidCause | None, seq: int,
             meta: dict[str, Any], forgeable: bool, parent: Parent | None) -> tuple[AttemptRecord, NetPolicy]:
        if parent is not None:
            return self._forked(task, policy_args, fault, seq, meta, parent)
        slots = self.forgeable if forgeable else self.slots
        slot = slots.get()
        try:
            policy = NetPolicy(**policy_args, env=slot.env, step_timeout_s=self.cfg.rollout.step_timeout_s)
            rec = run_attempt(slot, task, policy, self.cfg.rollout, self.canaries, run_id=self.run_id, seq=seq,
                              seed=0, fault=fault, meta=meta)
            return rec, policy
        finally:
            slots.put(slot)

    def _forked(self, task: Task, policy_args: dict[str, Any], fault: InvalidCause | None, seq: int,
                meta: dict[str, Any], parent: Parent) -> tuple[AttemptRecord, NetPolicy]:
        """A continuation forked from the group's prepared parent (gate 1 checks it is faithful)."""
        child, cost = costed_fork(parent.method, parent.generation)  # creation wherever paid, hand-over apart
        try:
            policy = NetPolicy(**policy_args, env=child.env, step_timeout_s=self.cfg.rollout.step_timeout_s,
                               prefix=self.cfg.prefix(), forked=True, prefix_exit=parent.last_exit)
            fork = {"method": parent.method.name, "creation_s": cost.creation_s, "handover_s": cost.handover_s,
                    "parent": parent.box_id}
            meta = {**meta, "extra": {**meta["extra"], "fork": fork}}
            rec = run_attempt(child, task, policy, self.cfg.rollout, self.canaries, run_id=self.run_id, seq=seq,
                              seed=0, fault=fault, meta=meta, prepared=parent.prepared)
            return rec, policy
        finally:
            child.destroy()

    def prepare(self, task: Task, forgeable: bool) -> Parent:
        """A group's parent: a fresh sandbox, the task's verified reset, the prefix actions; its work
        folder is copied once (the ``file`` fork method)."""
        make_env = ForgeableCodingEnv if forgeable else self.make_env
        slot = Slot(self.substrate, make_env())
        slot.provision(task)
        try:
            slot.env.reset(task)
            gates.check_reset(slot.env, task)
            space, last_exit = self.space(task), None
            specs = [space.specs[i] for i in self.cfg.prefix()]
            for spec in specs:
                obs = slot.env.step(Action.of(spec, slot.env.generation), self.cfg.rollout.step_timeout_s * 10)
                gates.check_observation(slot.env, obs)
                last_exit = int(obs.content.get("exit_code", 0))
            method = FileCopy(self.substrate, make_env, task, specs, self.cfg.rollout.step_timeout_s)
            method.prepare(slot)
            return Parent(slot, method, slot.env.capture(), slot.env.generation, last_exit, slot.env.box.id)
        except BaseException:
            slot.destroy()
            raise

    def batch(self, items: Sequence[tuple[Task, dict[str, Any], InvalidCause | None, dict[str, Any]]],
              forgeable: bool = False, parents: dict[str, Parent] | None = None
              ) -> list[tuple[AttemptRecord, NetPolicy]]:
        """Run the attempts at once (``concurrency`` at a time; ``forgeable``: on the integrity-off
        environment; ``parents``: forked from the task's parent); record each in the ledger; results in
        the order given."""
        futures: list[Future[tuple[AttemptRecord, NetPolicy]]] = []
        for task, args, fault, meta in items:
            parent = None if parents is None else parents[task.id]
            futures.append(self.pool.submit(self._one, task, args, fault, self.seq, meta, forgeable, parent))
            self.seq += 1
        out = []
        for f in futures:
            rec, policy = f.result()
            self.ledger.record(rec, self.seg)
            out.append((rec, policy))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for slots in (self.slots, self.forgeable):
            while not slots.empty():
                slots.get().destroy()


def _meta(arm: Arm, seed: int, phase: str, iteration: int, group: int, member: int, retry: int,
          concurrency: int = 1) -> dict[str, Any]:
    return {"window": f"{arm.label}/s{seed}", "concurrency": concurrency,
            "extra": {"train": {"treatment": arm.label, "rule": arm.treatment.value,
                                "integrity": "on" if arm.integrity else "off",
                                "start": "fork" if arm.fork and phase == "train" else "scratch", "seed": seed,
                                "phase": phase,
                                "iteration": iteration, "group": group, "member": member, "retry": retry}}}


def _policy_artifact(snap: Snapshot) -> dict[str, Any]:
    p = snap.start_probs()
    return {"start_probs": {SLOTS[i]: float(v) for i, v in enumerate(p)},
            "mass_golden": float(p[GOLDEN_SLOT]), "mass_sabotage": float(sum(p[i] for i in SABOTAGE_SLOTS)),
            "mass_test": float(p[SLOTS.index("test")])}


class Acting(Protocol):
    """What the update needs of the policy that acted in an attempt."""

    decisions: list[Decision]


def train_one(runner: _Runner | RayRunner, split: Split, cfg: TrainConfig, arm: Arm, seed: int,
              progress: Progress, tick: Callable[[Progress], None]) -> None:
    """One arm (treatment, integrity), one seed: evaluate, train, evaluate; everything in the ledger.
    Evaluation always runs on the honest environment (integrity on), without faults."""
    import torch

    from drumsbench.train.grpo import update
    from drumsbench.train.policy_net import make_net

    torch.manual_seed(seed)
    net = make_net(cfg.max_actions, seed)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    faults = FaultModel(mode=cfg.fault_mode, seed=seed, scale=cfg.fault_scale)
    treatment = arm.treatment
    label = f"{arm.label}/s{seed}"
    ledger, run_id = runner.ledger, runner.run_id

    def evaluate(iteration: int, snap: Snapshot) -> None:
        items = []
        episodes = cfg.final_eval_episodes if iteration == cfg.iterations else cfg.eval_episodes
        for ti, task in enumerate(split.eval):
            for ep in range(episodes):
                key = (iteration, ti, ep, 0)
                args: dict[str, Any] = {"snapshot": snap, "space": runner.space(task), "key": key, "seed": seed,
                                        "phase": "eval", "prefix": cfg.prefix()}
                items.append((task, args, None,
                              _meta(arm, seed, "eval", iteration, ti, ep, 0, cfg.concurrency)))
        done = runner.batch(items)
        progress.attempts += len(done)
        ledger.put_artifact(run_id, "train-policy", f"{label}/i{iteration}", _policy_artifact(snap))

    runner.seg = ledger.start_segment(run_id, os.getpid(), label)
    try:
        snap = Snapshot.of(net, cfg.max_actions)
        evaluate(0, snap)
        for it in range(cfg.iterations):
            progress.label = f"{label} iteration {it + 1}/{cfg.iterations}"
            tick(progress)
            rng = random.Random(f"{seed}:tasks:{it}")
            chosen = rng.sample(split.train, min(cfg.groups, len(split.train)))
            members: dict[tuple[int, int], tuple[AttemptRecord, Acting]] = {}
            parents = (dict(zip([t.id for t in chosen], runner.pool.map(
                lambda t: runner.prepare(t, not arm.integrity), chosen), strict=True)) if arm.fork else None)
            pending = [(g, m, 0) for g in range(len(chosen)) for m in range(cfg.group_size)]
            retries = 0
            while pending:
                items = []
                for g, m, r in pending:
                    task = chosen[g]
                    key = (it, g, m, r)
                    fault = InvalidCause.VERIFIER_UNAVAILABLE if faults.verifier_fires(key, task.id) else None
                    args = {"snapshot": snap, "space": runner.space(task), "key": key, "seed": seed,
                            "phase": "train", "faults": faults}
                    if not arm.fork:
                        args["prefix"] = cfg.prefix()
                    items.append((task, args, fault,
                                  _meta(arm, seed, "train", it, g, m, r, cfg.concurrency)))
                results: Sequence[tuple[AttemptRecord, Acting]] = runner.batch(items, forgeable=not arm.integrity,
                                                                                parents=parents)
                progress.attempts += len(results)
                nxt = []
                for (g, m, r), (rec, pol) in zip(pending, results, strict=True):
                    members[(g, m)] = (rec, pol)
                    if rec.cause is not None:
                        progress.invalid += 1
                        if treatment is Treatment.RETRY and r + 1 <= cfg.max_retries:
                            nxt.append((g, m, r + 1))
                            retries += 1
                pending = nxt
                tick(progress)
            for parent in (parents or {}).values():
                parent.slot.destroy()
            batch: list[Sample] = []
            advantages: dict[str, float | None] = {}
            for g in range(len(chosen)):
                group = [members[(g, m)] for m in range(cfg.group_size)]
                adv = group_advantages([rec.reward for rec, _ in group], treatment)
                for (rec, pol), a in zip(group, adv, strict=True):
                    batch.append(Sample(rec.seq, pol.decisions, a))
                    advantages[str(rec.seq)] = a
            stats = update(net, opt, batch, cfg.clip, cfg.epochs)
            ledger.put_artifact(run_id, "train-batch", f"{label}/i{it}", {
                "treatment": arm.label, "seed": seed, "iteration": it, "in_loss": stats.in_loss,
                "out_of_loss": stats.out_of_loss, "advantages": advantages, "decisions": stats.decisions,
                "loss": stats.loss, "retries": retries, "tasks": [t.id for t in chosen]})
            snap = Snapshot.of(net, cfg.max_actions)
            if (it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations:
                evaluate(it + 1, snap)
            progress.done += 1
            tick(progress)
    finally:
        ledger.heartbeat(run_id, runner.seg)


def select_tasks(cfg: TrainConfig) -> list[Task]:
    """The suite's tasks (``cfg.only`` of them when given); ``UsageError`` for a non-coding suite or an
    unknown task id."""
    suite = suites.load(cfg.tasks)
    if suite.kind != "coding":
        raise UsageError(f"--tasks: drumsbench train acts in the coding environment; {cfg.tasks} is a "
                         f"{suite.kind} suite")
    tasks = list(suite.tasks)
    if cfg.only:
        unknown = sorted(set(cfg.only) - {t.id for t in tasks})
        if unknown:
            raise UsageError(f"--task-ids: no task {', '.join(unknown)} in {cfg.tasks}; `drumsbench tasks list` "
                             "shows them")
        tasks = [t for t in tasks if t.id in cfg.only]
    return tasks


def run_train(cfg: TrainConfig, substrate: Substrate, ledger: Ledger, run_id: str,
              on_progress: Callable[[Progress], None] = lambda _p: None) -> None:
    """The whole experiment; the caller creates the run and builds the report (``rebuild``)."""
    suite = suites.load(cfg.tasks)
    split = split_tasks(select_tasks(cfg), cfg.holdout_every)
    control = positive_control(substrate)
    ledger.record_control(run_id, "train", "isolation", control.fired, control.detail)
    ledger.put_artifact(run_id, "train-split", "tasks", {"train": [t.id for t in split.train],
                                                         "eval": [t.id for t in split.eval]})
    model = FaultModel(mode=cfg.fault_mode, scale=cfg.fault_scale)
    ledger.put_artifact(run_id, "train-faults", "model", {
        "mode": cfg.fault_mode.value, "describe": model.describe(),
        "step_rates": {s: model.step_rate(i) for i, s in enumerate(SLOTS)}})
    runner: _Runner | RayRunner
    if cfg.executor == "ray":
        from drumsbench.train.ray_runner import RayRunner

        runner = RayRunner(substrate, suite, cfg, ledger, run_id)
    else:
        runner = _Runner(substrate, suite, cfg, ledger, run_id)
    progress = Progress(total=len(cfg.arms()) * len(cfg.seeds) * cfg.iterations)
    t0 = time.monotonic()
    from drumsbench.train.grpo import torch_scratch

    try:
        with torch_scratch():
            for seed in cfg.seeds:
                for arm in cfg.arms():
                    train_one(runner, split, cfg, arm, seed, progress, on_progress)
    finally:
        runner.close()
    ledger.put_artifact(run_id, "train-wall", "total", {"wall_s": time.monotonic() - t0})


__all__ = ["RUN_KIND", "Arm", "Progress", "Split", "TrainConfig", "run_train", "select_tasks", "split_tasks",
           "train_one"]
