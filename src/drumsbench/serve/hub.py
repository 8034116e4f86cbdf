"""The server side of served episodes: one ``Hub`` per server (its substrate, its run in the ledger,
its capacity), one ``Episode`` per attempt.

An episode is ``rollout.run_attempt`` — the same gates in the same order as ``drumsbench run`` —
in a thread of its own, with a ``RemotePolicy`` whose ``act`` publishes the observation to the
client and waits for the client's next action. When the session ends before the client submitted
(it disconnected, it was reaped after the idle limit, it reset mid-episode, or a stateless HTTP
``/reset`` returned), ``act`` raises ``PolicyUnavailable``: the attempt is
``invalid/policy_unavailable`` and recorded; the session's sandbox is destroyed when the session
closes. Every attempt goes to the ledger with ``extra.client``, so ``drumsbench report`` shows served
traffic like any run, with per-client counts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from drumsbench.core import host_state as state
from drumsbench.core.errors import PolicyUnavailable, UsageError
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import Action, ActionSpec, Observation, Task
from drumsbench.ledger import Ledger
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, positive_control
from drumsbench.substrates.base import Sandbox, Substrate


class AtCapacity(RuntimeError):
    """Every session slot holds a live sandbox: come back later (HTTP 503; a WebSocket error frame)."""


class ServeConfig(BaseModel):
    substrate: str = "process"
    tasks: str = "coding"
    max_sessions: int = Field(8, ge=1, le=1024)
    idle_s: float = Field(60.0, gt=0)
    seed: int = 0
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    # What the report's conditions line reads:
    policy: str = "remote (served)"
    concurrency: int = 0


class _Abort:
    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(frozen=True)
class _Current:
    """An action the client sent without a generation: it is for the observation it is answering
    (every number the client sends, a negative one too, is checked as given)."""

    kind: str
    payload: dict[str, Any]


class RemotePolicy(Policy):
    """The client is the policy: ``act`` hands the observation out and waits for an action."""

    def __init__(self, episode: Episode, name: str) -> None:
        super().__init__()
        self.episode = episode
        self.name = name

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return []

    def act(self, obs: Observation) -> Action:
        ep = self.episode
        ep.outbox.put(("obs", obs))
        ep.waiting_since = time.monotonic()
        item = ep.inbox.get()
        ep.waiting_since = None
        if isinstance(item, _Abort):
            raise PolicyUnavailable(item.reason)
        if isinstance(item, _Current):
            return Action(item.kind, obs.generation, item.payload)
        return item


@dataclass
class Episode:
    hub: Hub
    slot: Slot
    task: Task
    seed: int
    client: str
    policy_name: str
    session: str
    inbox: queue.Queue[Action | _Current | _Abort] = field(default_factory=queue.Queue)
    outbox: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    record: AttemptRecord | None = None
    waiting_since: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def start(self) -> Episode:
        self.extra.update(client=self.client, session=self.session)
        threading.Thread(target=self._run, name=f"drumsbench-episode-{self.session}", daemon=True).start()
        return self

    def _run(self) -> None:
        hub = self.hub
        seq = hub.next_seq()
        policy = RemotePolicy(self, self.policy_name)
        rec = run_attempt(self.slot, self.task, policy, hub.cfg.rollout, hub.canaries, run_id=hub.run_id,
                          seq=seq, seed=self.seed, meta={
                              "host": hub.host, "executor": "serve", "concurrency": hub.cfg.max_sessions,
                              "extra": self.extra})  # read when the attempt ends: what ``abort`` added too
        try:
            hub.record(rec)
        finally:
            self.record = rec
            self.outbox.put(("final", rec))

    def next(self, timeout: float) -> tuple[str, Any]:
        """The next observation (``("obs", Observation)``) or the end (``("final", AttemptRecord)``)."""
        try:
            return self.outbox.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the episode gave no answer within {timeout:g} s") from None

    def send(self, kind: str, generation: int | None, payload: dict[str, Any]) -> None:
        """The client's action; ``generation`` None: for the observation it answers."""
        self.inbox.put(_Current(kind, payload) if generation is None else Action(kind, generation, payload))

    def abort(self, reason: str, **extra: object) -> None:
        self.extra.update(extra)
        self.inbox.put(_Abort(reason))


class Hub:
    """One server's substrate, run, ledger and capacity. ``start`` before use, ``stop`` at the end:
    after ``stop`` no sandbox of the run exists."""

    def __init__(self, cfg: ServeConfig, out: Path, run_id: str | None = None, kind: str = "serve") -> None:
        from drumsbench.experiments.run import new_run_id

        self.cfg = cfg
        self.out = out
        self.kind = kind
        self.run_id = run_id or new_run_id()
        self.suite = suites.load(cfg.tasks)
        if not self.suite.tasks:
            raise UsageError(f"--tasks: suite {cfg.tasks!r} has no tasks")
        self.tasks = {t.id: t for t in self.suite.tasks}
        self.canaries = CanaryRegistry()
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        self._seq = 0
        self._workers = 0
        self._next_task = 0
        self.sessions = 0  # sessions holding a sandbox slot
        self.live: dict[int, Sandbox] = {}
        self.envs: dict[str, Any] = {}  # sessions holding a slot (``ServedEnv`` by id)
        self.ledger: Ledger | None = None
        self.substrate: Substrate | None = None
        self.segment = 0
        self.reaped = 0
        self.started = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Hub:
        from drumsbench.core.machine import commit, machine_info
        from drumsbench.experiments.run import make_substrate, open_ledger

        self.substrate = make_substrate(self.cfg.substrate, self.run_id, self.cfg.tasks)
        self.ledger = open_ledger(self.out)
        cfg = self.cfg.model_copy(update={"concurrency": self.cfg.max_sessions})
        self.ledger.create_run(self.run_id, self.kind, cfg.model_dump(mode="json"), machine_info(), commit())
        state.register(self.run_id, [self.cfg.substrate], self.ledger.path)
        try:
            self.segment = self.ledger.start_segment(self.run_id, os.getpid(), "")
            control = positive_control(self.substrate)
            self.ledger.record_control(self.run_id, "", "isolation", control.fired, control.detail)
        except BaseException:  # nothing of a server that never served stays behind
            self.substrate.close()
            state.unregister(self.run_id)
            self.ledger.set_status(self.run_id, "failed")
            self.ledger.close()
            raise
        self.started = True
        return self

    def stop(self) -> None:
        """Destroy what is left (sessions' own ``close`` normally did), close the run."""
        if not self.started:
            return
        self.started = False
        for env in list(self.envs.values()):
            env.close_reason = "the server stopped before the client submitted"
            with contextlib.suppress(Exception):  # best effort: the sandboxes go below in any case
                env.close()
        with self._lock:
            boxes = list(self.live.values())
            self.live.clear()
        for box in boxes:
            with contextlib.suppress(Exception):  # best effort; the substrate's close removes the rest
                box.destroy()
        assert self.ledger is not None and self.substrate is not None
        with self._lock:
            self.ledger.heartbeat(self.run_id, self.segment)
            self.ledger.set_status(self.run_id, "complete")
        self.substrate.close()
        state.unregister(self.run_id)
        self.ledger.close()

    # -- capacity and bookkeeping ---------------------------------------------------------------
    def acquire(self) -> int:
        """A sandbox slot for a session (its worker number), or ``AtCapacity`` at once."""
        with self._lock:
            if self.sessions >= self.cfg.max_sessions:
                raise AtCapacity(f"at capacity: {self.sessions} of {self.cfg.max_sessions} sessions hold a "
                                 "sandbox; retry later")
            self.sessions += 1
            self._workers += 1
            return self._workers

    def release(self) -> None:
        with self._lock:
            self.sessions = max(0, self.sessions - 1)

    def make_slot(self, worker: int) -> Slot:
        assert self.substrate is not None, "Hub.start() first"

        def track(box: Sandbox | None) -> None:
            with self._lock:
                if box is None:
                    self.live.pop(worker, None)
                else:
                    self.live[worker] = box

        return Slot(self.substrate, self.suite.make_env(), worker=worker, on_sandbox=track)

    def pick_task(self, task: str | None, seed: int | None) -> Task:
        if task is not None:
            if task not in self.tasks:
                raise ValueError(f"task: unknown task {task!r}; known: {', '.join(sorted(self.tasks))}")
            return self.tasks[task]
        tasks = self.suite.tasks
        if seed is not None:
            return tasks[seed % len(tasks)]
        with self._lock:
            self._next_task += 1
            return tasks[(self._next_task - 1) % len(tasks)]

    def next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq - 1

    def record(self, rec: AttemptRecord) -> None:
        assert self.ledger is not None
        with self._lock:
            self.ledger.record(rec, self.segment)

    def status(self) -> dict[str, object]:
        with self._lock:
            return {"run_id": self.run_id, "sessions": self.sessions, "sandboxes": len(self.live),
                    "max_sessions": self.cfg.max_sessions, "idle_s": self.cfg.idle_s, "attempts": self._seq,
                    "reaped": self.reaped, "substrate": self.cfg.substrate, "tasks": self.cfg.tasks}
