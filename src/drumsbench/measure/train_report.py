"""The typed train report: what ``drumsbench train`` prints, writes with ``--json`` and stores in
the ledger (artifact kind ``train-summary``), rebuilt from the ledger alone by ``train/rebuild.py``.
It lives in ``measure/`` (beside the other artifact models) so the HTML report reads it without
importing the trainer.

Schema ``drumsbench.train-report/1``. Every success figure is over the clean evaluation set (no
injected faults); intervals are 95%. ``Estimate`` is ``drumsbench.measure.stats.Estimate``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from drumsbench.measure.cost import HostPrice
from drumsbench.measure.stats import Estimate


class CurvePoint(BaseModel):
    """Evaluation after ``iteration`` updates, for one treatment, over seeds."""

    iteration: int
    train_attempts: float = Field(description="mean training attempts per seed so far (retries included)")
    success: Estimate = Field(description="mean over seeds of the eval success rate; t interval over seeds")
    per_seed: list[float | None]
    mass_golden: float = Field(description="mean over seeds of the first-step probability of the golden patch")
    mass_sabotage: float = Field(description="mean over seeds of the first-step probability of any adversary action")
    mass_test: float = Field(description="mean over seeds of the first-step probability of running the tests")


class Curve(BaseModel):
    treatment: str
    points: list[CurvePoint]


class FinalEval(BaseModel):
    treatment: str
    success: Estimate = Field(description="mean over seeds; t interval over seeds")
    pooled: Estimate = Field(description="all final eval attempts of all seeds pooled; Wilson interval")
    per_seed: list[float | None]
    successes: int
    valid: int


class Comparison(BaseModel):
    """Final eval success of ``a`` minus ``b`` (same seeds, so paired by seed)."""

    a: str
    b: str
    difference: Estimate = Field(description="mean paired difference over seeds; paired t interval")
    p_paired_permutation: float | None = Field(description="exact sign-flip test over the seeds' differences")
    p_fisher: float | None = Field(description="Fisher's exact test on the pooled final eval attempts")
    note: str


class TreatmentCost(BaseModel):
    """The training phase of one treatment, all seeds."""

    treatment: str
    attempts: int
    valid: int
    success: int
    invalid: dict[str, int]
    invalid_rate: Estimate
    retries: int
    invalid_in_loss: int = Field(description="invalid attempts whose decisions entered the loss")
    host_s: float = Field(description="wall time of this treatment's runs (training and evaluation)")
    s_per_valid_rollout: float | None
    usd_per_valid_rollout: float | None
    reached_90: int = Field(0, description="seeds whose eval success reached 90% at some eval point")
    host_s_to_90: Estimate | None = Field(None, description="host seconds from the start of a seed's run to the "
                                                            "first eval point at >= 90%, mean over the seeds that "
                                                            "reached it; t interval")
    usd_to_90: Estimate | None = None


class TrainReport(BaseModel):
    KIND: ClassVar[str] = "train-summary"
    schema_: str = Field("drumsbench.train-report/1", alias="schema")
    run_id: str
    substrate: str
    suite: str
    train_tasks: list[str]
    eval_tasks: list[str]
    treatments: list[str]
    seeds: list[int]
    fault_mode: str
    faults: str
    iterations: int
    groups: int
    group_size: int
    curves: list[Curve]
    finals: list[FinalEval]
    comparisons: list[Comparison]
    costs: list[TreatmentCost]
    isolation_control_fired: bool
    price: HostPrice
    config: dict[str, Any]
    conditions: str

    model_config = {"populate_by_name": True}


__all__ = ["Comparison", "Curve", "CurvePoint", "FinalEval", "TrainReport", "TreatmentCost"]
