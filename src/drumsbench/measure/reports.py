"""Report models of the sweep and the projection: built by ``experiments/`` from the ledger, read by
``report/`` (terminal) and written as JSON. They live here, below both, so a renderer never imports
an experiment."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from drumsbench.measure import projection
from drumsbench.measure.cost import INFERENCE_EXCLUDED, Attribution, HostFigure
from drumsbench.measure.stats import Estimate
from drumsbench.measure.summary import RunHeader
from drumsbench.measure.windows import WindowVerdict

SWEEP_SCHEMA = "drumsbench.sweep-report/1"


class NotRun(BaseModel):
    concurrency: int
    reason: str


class SteadyState(BaseModel):
    concurrency: int | None
    windows: list[str]
    valid: int
    hours: float
    valid_per_host_hour: Estimate
    held: bool
    note: str


class SweepReport(RunHeader):
    schema_: str = SWEEP_SCHEMA
    criteria: dict[str, Any]
    host_seconds: float
    windows: list[WindowVerdict]
    not_run: list[NotRun]
    climb_stopped: str | None
    n_max: int | None
    n_max_reason: str
    soak: WindowVerdict | None
    soak_held: bool
    steady_state: SteadyState
    bursts: list[WindowVerdict]
    prices: list[HostFigure]
    attribution: list[Attribution]
    inference_cost: str = INFERENCE_EXCLUDED
    conditions: str
    leaks_passed: bool | None = None  # every judged window's leak check passed (None: none judged)
    leaks_note: str = ""

    def dump(self) -> dict[str, Any]:
        d = self.model_dump(mode="json", by_alias=True)
        d["schema"] = d.pop("schema_")
        return {"schema": d.pop("schema"), **d}




class ProjectionReport(BaseModel):
    schema_: str = projection.PROJECTION_SCHEMA
    trajectories: int
    steps: int
    formula: str = "worker_hours = (cold_start + steps x per_step_overhead + verify) x trajectories / 3600"
    full_formula: str = "worker_hours_full = (cold_start + steps x per_step_overhead + verify + harness) x " \
                        "trajectories / 3600"
    runs: list[str]
    machine: dict[str, Any]
    commit: str
    projections: list[projection.Projection]
    checks_within: bool | None

    def dump(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        return {"schema": d.pop("schema_"), **d}
