"""Real injected faults for training, at rates that depend on the action or the task (or not).

Contracts:
- Every draw is a uniform number from a hash of (seed, what, iteration, group, member, retry,
  step); nothing else enters it — not the treatment, not the ledger's sequence number — so every
  treatment sees the same fault draws for the same seed. Whether a draw *fires* depends on the
  action taken at that step (``correlated``) or not (``uniform``).
- A step fault is the real ``step_timeout`` injector of ``drumsbench.rollout.faults`` (the host freezes the
  sandbox) called after the policy chose its action and before the action runs; the rollout's
  gates then find the frozen sandbox and make the attempt ``invalid/step_timeout``.
- A verifier fault is the real ``verifier_unavailable`` injector (the staged runner damaged from
  the host), passed to ``run_attempt`` as the attempt's fault.

Modes (rates per step for step faults, per attempt for verifier faults):

| mode | step faults | verifier faults |
|---|---|---|
| ``correlated`` | ``test`` (the visible suite) 10%, ``golden`` (the fix) 6%, others 1% | ``invoice`` tasks 6% |
| ``uniform`` | every action 3% | every task 3% |
| ``none`` | 0 | 0 |
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from pydantic import BaseModel, Field

from drumsbench.train.action_space import SLOTS


class FaultMode(StrEnum):
    CORRELATED = "correlated"
    UNIFORM = "uniform"
    NONE = "none"


CORRELATED_STEP = {"test": 0.10, "golden": 0.06}
CORRELATED_STEP_OTHER = 0.01
CORRELATED_VERIFIER = {"invoice": 0.06}
UNIFORM_STEP = 0.03
UNIFORM_VERIFIER = 0.03


def unit(*key: object) -> float:
    """A uniform number in [0, 1) from the key (sha256; identical on every machine and run)."""
    h = hashlib.sha256(":".join(str(k) for k in key).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class FaultModel(BaseModel, frozen=True):
    """Which faults an attempt of (iteration, group, member, retry) meets, for one seed."""

    mode: FaultMode = FaultMode.CORRELATED
    seed: int = 0
    scale: float = Field(1.0, ge=0.0, le=10.0, description="multiplies every rate (sensitivity runs, tests)")

    def step_rate(self, slot: int) -> float:
        if self.mode is FaultMode.NONE or SLOTS[slot] == "submit":
            return 0.0
        if self.mode is FaultMode.UNIFORM:
            return min(1.0, UNIFORM_STEP * self.scale)
        return min(1.0, CORRELATED_STEP.get(SLOTS[slot], CORRELATED_STEP_OTHER) * self.scale)

    def verifier_rate(self, task_id: str) -> float:
        if self.mode is FaultMode.NONE:
            return 0.0
        if self.mode is FaultMode.UNIFORM:
            return min(1.0, UNIFORM_VERIFIER * self.scale)
        project = task_id.split("-", 1)[0]
        return min(1.0, CORRELATED_VERIFIER.get(project, 0.0) * self.scale)

    def step_draw(self, key: tuple[int, int, int, int], step: int) -> float:
        return unit(self.seed, "step", *key, step)

    def verifier_draw(self, key: tuple[int, int, int, int]) -> float:
        return unit(self.seed, "verifier", *key)

    def step_fires(self, key: tuple[int, int, int, int], step: int, slot: int) -> bool:
        return self.step_draw(key, step) < self.step_rate(slot)

    def verifier_fires(self, key: tuple[int, int, int, int], task_id: str) -> bool:
        return self.verifier_draw(key) < self.verifier_rate(task_id)

    def describe(self) -> str:
        if self.scale != 1.0 and self.mode is not FaultMode.NONE:
            return f"{self.model_copy(update={'scale': 1.0}).describe()}; every rate x {self.scale:g}"
        if self.mode is FaultMode.CORRELATED:
            steps = ", ".join(f"{k} {v:.0%}" for k, v in CORRELATED_STEP.items())
            return (f"correlated: step freeze {steps}, other actions {CORRELATED_STEP_OTHER:.0%}; "
                    f"verifier damaged on {', '.join(f'{k} {v:.0%}' for k, v in CORRELATED_VERIFIER.items())}")
        if self.mode is FaultMode.UNIFORM:
            return f"uniform: step freeze {UNIFORM_STEP:.0%} on every action; verifier damaged {UNIFORM_VERIFIER:.0%}"
        return "none"


__all__ = ["FaultMode", "FaultModel", "unit"]
