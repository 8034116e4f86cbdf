"""The policy: a small MLP over features of the real observations, and the rollout ``Policy`` that
samples from it.

Contracts:
- ``features(taken, last_exit, step)`` is the whole state the network sees: which slots were
  taken so far in this episode, the exit code of the last observation (none / 0 / non-zero) and
  the step index. It is computed from the environment's real observations.
- Acting uses a frozen float64 numpy copy of the network (``Snapshot``), so sampling in worker
  threads never touches torch and is identical for identical weights. Every sample is drawn from
  a ``random.Random`` keyed by (seed, phase, iteration, group, member, retry) — never by the
  ledger's sequence number — so two treatments with the same weights take the same actions.
- An episode has at most ``max_actions`` chosen actions; then the policy submits (a forced
  submit is marked and never enters the loss).
- With a ``prefix`` (slots that prepare the state), a run from scratch plays the prefix first (no
  decisions, no faults); a ``forked`` continuation starts after it, seeing the parent's last exit
  code (``prefix_exit``) — both then see the same features at their first decision.
- ``NetPolicy`` may carry a ``FaultModel``: when a step's draw fires for the chosen action, the
  real ``step_timeout`` injector freezes the sandbox from the host before the action runs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from drumsbench.core.outcome import InvalidCause
from drumsbench.envs.base import Action, ActionSpec, Environment, Observation, Task
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.faults import injector_for
from drumsbench.train.action_space import N_ACTIONS, SLOTS, SUBMIT_SLOT, ActionSpace
from drumsbench.train.fault_model import FaultModel

if TYPE_CHECKING:
    import torch

HIDDEN = 32


def n_features(max_actions: int) -> int:
    return (N_ACTIONS - 1) + 3 + max_actions


def features(taken: list[int], last_exit: int | None, step: int, max_actions: int) -> np.ndarray:
    x = np.zeros(n_features(max_actions))
    for a in taken:
        if a != SUBMIT_SLOT:
            x[a] = 1.0
    base = N_ACTIONS - 1
    x[base + (0 if last_exit is None else 1 if last_exit == 0 else 2)] = 1.0
    x[base + 3 + min(step, max_actions - 1)] = 1.0
    return x


def make_net(max_actions: int, seed: int) -> torch.nn.Sequential:
    """The network, initialised from ``seed`` alone (same seed: same weights)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(n_features(max_actions), HIDDEN), torch.nn.Tanh(),
                              torch.nn.Linear(HIDDEN, N_ACTIONS)).double()
    with torch.no_grad():
        for p in net.parameters():
            bound = 1.0 / math.sqrt(p.shape[-1])
            p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 * bound - bound)
    return net


@dataclass(frozen=True)
class Snapshot:
    """The network's weights frozen as numpy arrays, for acting."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    max_actions: int

    @classmethod
    def of(cls, net: torch.nn.Sequential, max_actions: int) -> Snapshot:
        import torch

        l1, l2 = net[0], net[2]  # the network (``make_net``): Linear, Tanh, Linear
        assert isinstance(l1, torch.nn.Linear) and isinstance(l2, torch.nn.Linear)
        return cls(l1.weight.detach().numpy().copy(), l1.bias.detach().numpy().copy(),
                   l2.weight.detach().numpy().copy(), l2.bias.detach().numpy().copy(), max_actions)

    def probs(self, x: np.ndarray) -> np.ndarray:
        h = np.tanh(self.w1 @ x + self.b1)
        z = self.w2 @ h + self.b2
        z = z - z.max()
        e = np.exp(z)
        return np.asarray(e / e.sum())

    def start_probs(self) -> np.ndarray:
        """The distribution over slots at an episode's first step."""
        return self.probs(features([], None, 0, self.max_actions))


@dataclass
class Decision:
    x: list[float]
    action: int
    logp: float


@dataclass
class NetPolicy(Policy):
    """Samples slots from ``snapshot`` for one attempt; keeps its decisions for the update."""

    snapshot: Snapshot
    space: ActionSpace
    key: tuple[int, int, int, int]
    seed: int
    phase: str = "train"
    faults: FaultModel | None = None
    env: Environment | None = None
    step_timeout_s: float = 1.0
    decisions: list[Decision] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    fault: dict[str, Any] | None = None
    forced_submit: bool = False
    prefix: tuple[int, ...] = ()
    forked: bool = False
    prefix_exit: int | None = None
    name = "grpo-net"

    def __post_init__(self) -> None:
        super().__init__()
        self.rng = random.Random(f"{self.seed}:{self.phase}:{':'.join(map(str, self.key))}")

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return []  # acts from observations, never from a plan

    def begin(self, task: Task, rng: random.Random) -> None:
        self.decisions, self.fault, self.forced_submit = [], None, False
        # A continuation of a fork starts after the prefix, which its parent already took.
        self.taken = list(self.prefix) if self.forked else []

    def act(self, obs: Observation) -> Action:
        step = len(self.taken)
        if step < len(self.prefix):  # from scratch: the prefix first (preparation, not a decision)
            self.taken.append(self.prefix[step])
            return Action.of(self.space.specs[self.prefix[step]], obs.generation)
        if len(self.decisions) >= self.snapshot.max_actions:
            self.forced_submit = True
            self.taken.append(SUBMIT_SLOT)
            return Action.of(self.space.specs[SUBMIT_SLOT], obs.generation)
        code = obs.content.get("exit_code")
        if step == 0:
            last_exit = None
        elif self.forked and step == len(self.prefix):
            last_exit = self.prefix_exit  # the parent's last observation, as a run from scratch sees it
        else:
            last_exit = None if code is None else int(code)
        x = features(self.taken, last_exit, step, self.snapshot.max_actions)
        p = self.snapshot.probs(x)
        a = self._sample(p)
        self.decisions.append(Decision(x.tolist(), a, float(math.log(max(p[a], 1e-300)))))
        self.taken.append(a)
        if (a != SUBMIT_SLOT and self.faults is not None and self.env is not None
                and self.faults.step_fires(self.key, step, a)):
            # The host freezes the sandbox now: the chosen action will run into the frozen sandbox.
            self.fault = {"cause": InvalidCause.STEP_TIMEOUT.value, "step": step, "slot": SLOTS[a]}
            injector_for(InvalidCause.STEP_TIMEOUT).before_step(self.env, 0.0, self.step_timeout_s)
        return Action.of(self.space.specs[a], obs.generation)

    def _sample(self, p: np.ndarray) -> int:
        u, acc = self.rng.random(), 0.0
        for i, pi in enumerate(p):
            acc += float(pi)
            if u < acc:
                return i
        return len(p) - 1

    def notes(self) -> dict[str, object]:
        return {"actions": [SLOTS[a] for a in self.taken], "forced_submit": self.forced_submit,
                "step_fault": self.fault}


__all__ = ["Decision", "NetPolicy", "Snapshot", "features", "make_net", "n_features"]
