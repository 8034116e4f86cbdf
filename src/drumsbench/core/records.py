"""Records that flow from a rollout to the ledger (one per attempt) and the run configuration."""

from __future__ import annotations

from pydantic import BaseModel, Field

from drumsbench.core.outcome import InvalidCause, Outcome


class AttemptRecord(BaseModel):
    """One attempt, start to end, with its phase timings in seconds."""

    run_id: str
    seq: int
    task: str
    substrate: str
    env: str
    policy: str
    executor: str = "local"
    host: str = ""
    worker: int = 0
    concurrency: int = 1
    window: str = ""
    generation: int = 0
    outcome: Outcome
    cause: InvalidCause | None = None
    reward: float | None = None
    injected: InvalidCause | None = None
    detail: str = ""
    t_start: float
    t_end: float
    provision_s: float = 0.0
    reset_s: float = 0.0
    steps_s: list[float] = Field(default_factory=list)
    verify_s: float = 0.0
    teardown_s: float = 0.0
    extra: dict[str, object] = Field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.t_end - self.t_start
