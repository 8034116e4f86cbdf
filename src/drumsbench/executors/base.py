"""What an executor runs: a ``Job`` hands out attempts; the executor runs them concurrently and
passes each finished ``AttemptRecord`` to a sink in the driver (the only ledger writer).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from drumsbench.core.outcome import InvalidCause
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.base import Environment, Task
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.faults import FaultPlan
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import Sandbox, Substrate


@dataclass(frozen=True)
class Work:
    seq: int
    task: Task
    fault: InvalidCause | None


@dataclass
class Job:
    """The attempts of one run segment: which task and fault each gets, and when to stop.

    ``next_work`` is thread-safe. The job stops handing out work after ``deadline`` (monotonic),
    after ``max_seq``, or once ``stop()`` was called.
    """

    run_id: str
    tasks: list[Task]
    make_policy: Callable[[], Policy]
    make_env: Callable[[], Environment[Any]]
    rollout: RolloutConfig
    faults: FaultPlan
    seed: int
    first_seq: int
    max_seq: int | None
    deadline: float | None
    meta: dict[str, object] = field(default_factory=dict)
    canaries: CanaryRegistry = field(default_factory=CanaryRegistry)
    _seq: int = -1
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)
    _live: dict[int, Sandbox] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._seq = self.first_seq

    def next_work(self) -> Work | None:
        with self._lock:
            if self.stopped.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline):
                return None
            if self.max_seq is not None and self._seq >= self.max_seq:
                return None
            seq = self._seq
            self._seq += 1
        return Work(seq, self.tasks[seq % len(self.tasks)], self.faults.draw(seq))

    def make_slot(self, substrate: Substrate, worker: int) -> Slot:
        def track(box: Sandbox | None) -> None:
            with self._lock:
                if box is None:
                    self._live.pop(worker, None)
                else:
                    self._live[worker] = box

        return Slot(substrate, self.make_env(), worker=worker, on_sandbox=track)

    def attempt(self, slot: Slot, policy: Policy, work: Work,
                extra_meta: dict[str, object] | None = None) -> AttemptRecord:
        return run_attempt(slot, work.task, policy, self.rollout, self.canaries, run_id=self.run_id, seq=work.seq,
                           seed=self.seed, fault=work.fault, meta={**self.meta, **(extra_meta or {})})

    def stop(self) -> None:
        """Stop handing out work and kill what is running (Ctrl-C): in-flight attempts are dropped."""
        self.stopped.set()
        with self._lock:
            boxes = list(self._live.values())
        for box in boxes:
            with contextlib.suppress(Exception):  # best effort on the way out; gc catches the rest
                box.destroy()
