"""Scripted policies: they choose actions from the task's plans, not from a model.

- ``oracle``: a few reads, then the task's fix (must succeed on every task);
- ``null``: submits at once (must fail every task);
- ``noisy``: the oracle's plan with probability ``p``, otherwise a plausible wrong fix;
- ``explorer``: ``steps`` real exploring actions, then the oracle's fix (trajectory-length
  experiments: up to 150 steps).

Contract: ``begin(task, rng)`` fixes the plan for one episode; ``act(obs)`` returns the next action
tagged with the generation of ``obs``. Policies never see hidden tests.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, Action, ActionSpec, Observation, Task

if TYPE_CHECKING:
    from drumsbench.policies.registry import PolicyArgs


class Policy(ABC):
    name: str

    def __init__(self) -> None:
        self._plan: list[ActionSpec] = []
        self._i = 0

    def begin(self, task: Task, rng: random.Random) -> None:
        self._plan = self.plan(task, rng)
        self._i = 0

    @abstractmethod
    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]: ...

    def notes(self) -> dict[str, object]:
        """What the ledger keeps of the current attempt's plan (``AttemptRecord.extra``)."""
        return {}

    def unsupported(self, kind: str) -> str | None:
        """Why this policy cannot act in environment kind ``kind`` (a one-line usage error, said
        before a run starts), or None. Default: every kind (plans come from the task itself)."""
        return None

    def act(self, obs: Observation) -> Action:
        spec = self._plan[self._i] if self._i < len(self._plan) else ActionSpec(SUBMIT)
        self._i += 1
        return Action.of(spec, obs.generation)


class Oracle(Policy):
    name = "oracle"

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return task.oracle_plan()


class Null(Policy):
    name = "null"

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return [ActionSpec(SUBMIT)]


class Noisy(Policy):
    name = "noisy"

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"--noisy-p: {p} is not a probability; give a number from 0 to 1")
        self.p = p

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        if rng.random() < self.p:
            return task.oracle_plan()
        return task.wrong_plan(rng.randrange(task.wrong_choices))


class Explorer(Policy):
    name = "explorer"

    def __init__(self, steps: int = 20) -> None:
        super().__init__()
        if not 0 <= steps <= 1000:
            raise UsageError(f"--explorer-steps: {steps} is out of range; give 0 to 1000")
        self.steps = steps

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        fix = [a for a in task.oracle_plan() if a.kind != "shell"]
        return [task.explore_action(i) for i in range(self.steps)] + fix


class Continue(Policy):
    """A branch continuation: after ``k`` prefix actions, solve with probability ``p``, else go wrong."""

    name = "continue"

    def __init__(self, k: int, p: float = 0.5) -> None:
        super().__init__()
        self.k, self.p = k, p

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        solve = rng.random() < self.p
        return task.continuation(self.k, solve, 0 if solve else rng.randrange(task.wrong_choices))


# -- factories of the policy registry (policies/registry.py) -------------------------------------------

def _no_arg(args: PolicyArgs) -> None:
    if args.arg:
        raise UsageError(f"--policy: {args.spec!r}: {args.spec.partition(':')[0]} takes no ':' argument")


def oracle(args: PolicyArgs) -> Policy:
    _no_arg(args)
    return Oracle()


def null(args: PolicyArgs) -> Policy:
    _no_arg(args)
    return Null()


def noisy(args: PolicyArgs) -> Policy:
    _no_arg(args)
    return Noisy(args.noisy_p)


def explorer(args: PolicyArgs) -> Policy:
    _no_arg(args)
    return Explorer(args.explorer_steps)


def make_policy(name: str, noisy_p: float = 0.5, explorer_steps: int = 20) -> Policy:
    """``--policy NAME[:ARG]`` -> a fresh policy (``policies/registry.py``)."""
    from drumsbench.policies.registry import make_policy as make

    return make(name, noisy_p, explorer_steps)
