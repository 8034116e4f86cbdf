"""The three outcomes of an attempt and the causes of an invalid one.

Contract: an attempt ends in exactly one ``Outcome``. ``success`` carries reward 1.0, ``failed``
reward 0.0, ``invalid`` carries no reward (``None``) and exactly one ``InvalidCause``. No other
combination can be constructed (``Verdict`` validates it), so an infrastructure fault can never
become reward 0.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, model_validator


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    INVALID = "invalid"


class InvalidCause(StrEnum):
    """Why an attempt is invalid, in gate order (the first gate that fires names the cause)."""

    DIRTY_RESET = "dirty_reset"
    STALE_GENERATION = "stale_generation"
    STEP_TIMEOUT = "step_timeout"
    EPISODE_TIMEOUT = "episode_timeout"
    BAD_OBSERVATION = "bad_observation"
    VERIFIER_UNAVAILABLE = "verifier_unavailable"
    CONTAMINATION = "contamination"
    SUBSTRATE_FAILURE = "substrate_failure"
    POLICY_UNAVAILABLE = "policy_unavailable"


class Verdict(BaseModel, frozen=True):
    """Outcome + reward + cause, always consistent."""

    outcome: Outcome
    reward: float | None
    cause: InvalidCause | None = None
    detail: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Verdict:
        expected = {Outcome.SUCCESS: 1.0, Outcome.FAILED: 0.0, Outcome.INVALID: None}[self.outcome]
        if self.reward != expected:
            raise ValueError(f"{self.outcome} must carry reward {expected}, not {self.reward}")
        if (self.outcome is Outcome.INVALID) != (self.cause is not None):
            raise ValueError("an invalid verdict needs exactly one cause; a valid one none")
        return self

    @classmethod
    def success(cls, detail: str = "") -> Verdict:
        return cls(outcome=Outcome.SUCCESS, reward=1.0, detail=detail)

    @classmethod
    def failed(cls, detail: str = "") -> Verdict:
        return cls(outcome=Outcome.FAILED, reward=0.0, detail=detail)

    @classmethod
    def invalid(cls, cause: InvalidCause, detail: str = "") -> Verdict:
        return cls(outcome=Outcome.INVALID, reward=None, cause=cause, detail=detail)

    @property
    def valid(self) -> bool:
        return self.outcome is not Outcome.INVALID
