"""The warm pool's figures in the cold-start experiment (``drumsbench coldstart``), as stored.

``PoolColdstartArtifact`` (kind ``coldstart-pool``, named by the substrate): acquire from a warm pool
beside the same run's create -> first command and raw floor (``ColdstartArtifact``); written by
``experiments/coldstart.py``, read by ``report/tables.py``. The pool's measured use and its price are
``measure.cost.PoolUse`` and ``measure.cost.pool_cost``.
"""

from __future__ import annotations

from typing import ClassVar

from drumsbench.measure.artifacts import Artifact, Latency
from drumsbench.measure.cost import CostLine, PoolUse


class PoolColdstartArtifact(Artifact):
    """One substrate's warm pool: hand-out latency, refill work, idle memory and the reserve's cost."""

    KIND: ClassVar[str] = "coldstart-pool"
    substrate: str
    mode: str
    size: int
    acquire: Latency  # acquire() alone: a checked sandbox handed out
    acquire_first_command: Latency  # acquire() until the first command (`true`) returned
    hits: int
    misses: int  # the pool was empty: acquire made the sandbox itself
    refused: int  # sandboxes that failed their check (destroyed, never handed out)
    fill_s: float | None  # the first fill, empty -> full (None: it did not fill in time)
    create_mean_s: float | None  # background: one create
    check_mean_s: float | None  # one start check (the root's digest)
    idle_memory_mib_each: float | None  # MemAvailable drop across the first fill / size
    idle_pss_mib_each: float | None  # PSS of the host processes labelled with the run / size
    use: PoolUse
    cost: CostLine  # the reserve over this measurement, per 1,000 hand-outs
    usd_per_hour_held: float | None  # holding ``size`` idle sandboxes for an hour (memory share)
    errors: list[str]
