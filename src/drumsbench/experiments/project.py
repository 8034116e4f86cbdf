"""``drumsbench project``: worker-hours for N trajectories of S steps, per substrate, from measurements.

Measurements come either from earlier runs (``--from RUN ...``: their valid attempts, grouped by
substrate and reset strategy) or from a *calibration* this command runs itself: short explorer
trajectories (``calibrate_steps`` exploring steps) at concurrency 1 on each substrate. With
``check`` > 0 it then runs that many *real* trajectories of ``steps`` steps on each substrate and
compares the projected time per trajectory with the measured one (target: within ``tolerance``).

Everything runs as one ledger run of kind ``project``; calibration and check alternate in rounds
(windows labelled ``calibrate:<substrate>/<reset>#<round>`` and ``check:<substrate>/<reset>#<round>``)
so that both meet the same load on the host.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from drumsbench.core.errors import UsageError
from drumsbench.envs import suites
from drumsbench.envs.base import SUBMIT
from drumsbench.experiments.run import RunConfig, execute
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts, projection
from drumsbench.measure.reports import ProjectionReport
from drumsbench.measure.windows import window_info
from drumsbench.rollout.attempt import RolloutConfig
from drumsbench.rollout.pool import PoolSetting
from drumsbench.substrates import registry
from drumsbench.substrates.base import ResetStrategy


class Target(BaseModel, frozen=True):
    """A substrate and its reset strategy: ``process``, ``process:recreate``, ``docker:in_place``;
    ``pool``: its warm pool (``rollout.pool``; 0: none), which the label shows as ``+pool``."""

    substrate: str
    reset: str  # in_place / recreate (resolved from the substrate's default when not given)
    pool: PoolSetting = 0

    @property
    def label(self) -> str:
        return pool_label(f"{self.substrate}/{self.reset}", self.pool)

    @classmethod
    def parse(cls, text: str, pool: PoolSetting = 0) -> Target:
        name, _, reset = text.strip().partition(":")
        cls_ = registry.get(name)
        strategies = [r.value for r in cls_.capabilities.reset_strategies]
        if not reset:
            reset = "in_place" if "in_place" in strategies else "recreate"
        if reset not in strategies:
            raise UsageError(f"--substrate {text}: {name} resets by {', '.join(strategies)}, not {reset!r}")
        return cls(substrate=name, reset=reset, pool=pool)


def pool_label(label: str, pool: PoolSetting | None) -> str:
    """``label`` with ``+pool`` when a warm pool served it (``auto`` or a size above 0)."""
    return f"{label}+pool" if pool not in (None, 0) else label


class ProjectConfig(BaseModel):
    """``policy``: ``explorer`` (cheap exploring steps, then the fix) or ``realistic`` (the realistic
    agent's real work on made tasks: reads, greps, test runs; its whole episode is the step budget)."""

    trajectories: int = Field(1_000_000, ge=1)
    steps: int = Field(150, ge=1, le=1000)
    targets: list[Target] = Field(default_factory=list)
    tasks: str = "coding"
    calibrate_attempts: int = Field(12, ge=2, le=10_000)
    calibrate_steps: int = Field(30, ge=0, le=1000)
    check: int = Field(0, ge=0, le=10_000)
    tolerance: float = Field(0.20, gt=0, le=10)
    step_timeout_s: float = Field(30.0, gt=0)
    episode_timeout_s: float = Field(600.0, gt=0)
    seed: int = 0
    policy: Literal["explorer", "realistic"] = "explorer"

    @field_validator("targets")
    @classmethod
    def _distinct(cls, v: list[Target]) -> list[Target]:
        if len({t.label for t in v}) != len(v):
            raise ValueError("each substrate/reset at most once")
        return v


def fix_length(tasks: str) -> int:
    """Steps the explorer takes after exploring (the oracle's non-shell actions) on this suite."""
    suite = suites.load(tasks)
    return max(len([a for a in t.oracle_plan() if a.kind not in ("shell", SUBMIT)]) for t in suite.tasks)


def _window_cfg(cfg: ProjectConfig, target: Target, role: str, explorer_steps: int, attempts: int) -> RunConfig:
    rollout = RolloutConfig(step_timeout_s=cfg.step_timeout_s, episode_timeout_s=cfg.episode_timeout_s,
                            reset=ResetStrategy(target.reset))
    policy = "explorer" if cfg.policy == "explorer" else f"realistic:{max(1, explorer_steps)}"
    return RunConfig(substrate=target.substrate, tasks=cfg.tasks, policy=policy, explorer_steps=explorer_steps,
                     concurrency=1, duration_s=None, max_attempts=attempts, seed=cfg.seed, rollout=rollout,
                     window=f"{role}:{target.label}", pool=target.pool)


def plan(cfg: ProjectConfig) -> list[tuple[str, int, int]]:
    """(role, round, attempts) in run order: calibration and check interleaved in ``check`` rounds.

    Interleaving makes both see the same host: a load that comes and goes (other work on the
    machine) lands on the calibration and the real trajectories alike.
    """
    rounds = max(1, min(cfg.check, cfg.calibrate_attempts)) if cfg.check else 1
    base, extra = divmod(cfg.calibrate_attempts, rounds)
    out = []
    for r in range(rounds):
        out.append(("calibrate", r, base + (1 if r < extra else 0)))
        if cfg.check:
            out.append(("check", r, cfg.check // rounds + (1 if r < cfg.check % rounds else 0)))
    return [x for x in out if x[2] > 0]


def run_projection(ledger: Ledger, run_id: str, cfg: ProjectConfig,
                   on_window: Callable[[str], None] | None = None) -> str:
    """Calibrate (and check) each target, one after the other; returns the run's final status."""
    # the explorer's fix actions come after its exploring steps; the realistic agent's budget is the episode
    check_steps = max(0, cfg.steps - fix_length(cfg.tasks)) if cfg.policy == "explorer" else cfg.steps
    status = "complete"
    for target in cfg.targets:
        for role, r, attempts in plan(cfg):
            steps = cfg.calibrate_steps if role == "calibrate" else check_steps
            wcfg = _window_cfg(cfg, target, f"{role}", steps, attempts)
            wcfg = wcfg.model_copy(update={"window": f"{wcfg.window}#{r}"})
            if on_window:
                on_window(f"{wcfg.window}: {attempts} {cfg.policy} trajectories of {steps} "
                          f"{'exploring ' if cfg.policy == 'explorer' else ''}steps")
            status, _ = execute(ledger, run_id, wcfg, resume=False)
            if status == "interrupted":
                ledger.set_status(run_id, status)
                return status
    ledger.set_status(run_id, status)
    return status


def _groups(ledger: Ledger, run_ids: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """(target label, role) -> {rows, substrate, reset, concurrency, source}; role ``calibrate`` or ``check``."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"rows": [], "source": []})
    for run_id in run_ids:
        run = ledger.run(run_id)
        infos = window_info(ledger, run_id)
        for row in ledger.attempts(run_id, ("window", "substrate", "concurrency", *projection.COLUMNS)):
            window, substrate, conc, rest = row[0], row[1], row[2], row[3:]
            wcfg = (infos.get(window) or {}).get("config") or run["config"].get("base") or run["config"]
            reset = (wcfg.get("rollout") or {}).get("reset")
            if not reset:
                caps = registry.get(substrate).capabilities.reset_strategies
                reset = "in_place" if ResetStrategy.IN_PLACE in caps else "recreate"
            role = "check" if window.startswith("check:") else "calibrate"
            # a calibration window of a pooled target says so in its label (``...+pool#r``); rows of
            # other runs (--from) are grouped by substrate and reset alone, pooled or not
            pooled = window.split("#", 1)[0].endswith("+pool")
            g = out[(pool_label(f"{substrate}/{reset}", "auto" if pooled else 0), role)]
            g.update(substrate=substrate, reset=reset)
            g.setdefault("concurrency", set()).add(conc)
            g["rows"].append(rest)
            if "#" in window and window.split(":", 1)[0] in ("calibrate", "check"):
                r = f"{run_id}#{window.rsplit('#', 1)[1]}"
                g.setdefault("rounds", {}).setdefault(r, []).append(rest)
            if run_id not in g["source"]:
                g["source"].append(run_id)
    return out


def build(ledger: Ledger, run_ids: list[str], trajectories: int, steps: int, tolerance: float = 0.2,
          seed: int = 0) -> ProjectionReport:
    if not run_ids:
        raise UsageError("--from: give at least one run id")
    groups = _groups(ledger, run_ids)
    projections = []
    for (label, role), g in sorted(groups.items()):
        if role != "calibrate":
            continue
        conc = max(g["concurrency"])
        p = projection.project(label, g["substrate"], g["reset"], conc, g["source"], g["rows"], trajectories,
                               steps, seed)
        if p is None:
            continue
        real = groups.get((label, "check"))
        if real:
            p.check = projection.check(p, g["rows"], real["rows"], tolerance, seed,
                                       calib_rounds=g.get("rounds"), real_rounds=real.get("rounds"))
        projections.append(p)
    if not projections:
        raise UsageError(f"--from {' '.join(run_ids)}: no valid attempt to measure")
    checks = [p.check.within for p in projections if p.check is not None]
    first = ledger.run(run_ids[0])
    return ProjectionReport(trajectories=trajectories, steps=steps, runs=run_ids, machine=first["machine"],
                            commit=first["commit"], projections=projections,
                            checks_within=all(checks) if checks else None)


def publish(ledger: Ledger, run_id: str, r: ProjectionReport) -> None:
    """Write each projection as the ``projection`` artifact the HTML report reads (docs/html-report.md)."""
    for p in r.projections:
        c = p.check
        artifacts.put(ledger, run_id, p.label, artifacts.ProjectionArtifact(
            substrate=p.label, trajectories=p.trajectories, steps=p.steps, cold_start_s=p.terms.cold_start,
            reset_s=p.terms.reset, per_step_s=p.terms.per_step, verify_s=p.terms.verify,
            # with a check: projected at the real runs' step count and start mix, like for like
            projected_s_per_trajectory=c.projected_s.value if c else p.per_trajectory_s.value,
            measured_s_per_trajectory=c.measured_s.value if c else None,
            worker_hours=p.worker_hours))
