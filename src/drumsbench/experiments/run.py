"""``drumsbench run``: attempts of one task suite on one substrate, recorded in the ledger.

A run stops at its duration or attempt count; ``resume`` continues a killed or interrupted run
with the same configuration, counting only the time it was alive, and never records an attempt
twice.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, model_validator

from drumsbench.core import host_state as state
from drumsbench.core.errors import LedgerUnwritable, UsageError
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.envs.base import Environment, TaskImages
from drumsbench.executors.base import Job
from drumsbench.executors.local import LocalExecutor
from drumsbench.experiments.leak_sampler import LeakSampler
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.cost import DEFAULT_PRICE, POOL_KIND, HostPrice
from drumsbench.measure.windows import ResourceSampler
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig
from drumsbench.rollout.faults import FaultPlan
from drumsbench.rollout.isolation import positive_control
from drumsbench.rollout.pool import DEFAULT_POOL, PooledSubstrate, PoolSetting, pool_size, pooled
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages, Substrate, with_flavor

if TYPE_CHECKING:
    from drumsbench.executors.ray import RayExecutor


class RunConfig(BaseModel):
    substrate: str = "process"
    tasks: str = "coding"
    policy: str = "oracle"
    noisy_p: float = Field(0.5, ge=0, le=1)
    explorer_steps: int = Field(20, ge=0, le=1000)
    concurrency: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=512)
    duration_s: float | None = Field(30.0, gt=0)
    max_attempts: int | None = Field(None, ge=1)
    inject: str = ""
    seed: int = 0
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    price: HostPrice = DEFAULT_PRICE
    window: str = ""
    executor: Literal["local", "ray"] = "local"  # ray: --concurrency is per node
    ray_address: str | None = None  # None: a local single-node Ray of the run's own
    # warm pool (rollout/pool.py): "auto" = one idle sandbox per concurrent attempt, 0 = off
    pool: PoolSetting = DEFAULT_POOL
    watch: bool = False  # run --watch: leak samples beside each segment of a plain run (``leaks`` artifacts)

    @model_validator(mode="after")
    def _bounded(self) -> RunConfig:
        if self.duration_s is None and self.max_attempts is None:
            raise UsageError("give --duration or --attempts: a run needs an end")
        if isinstance(self.pool, int) and self.pool < 0:
            raise UsageError(f"--pool: {self.pool} is negative; give auto, off or a number of sandboxes")
        if self.executor == "ray" and self.pool not in ("auto", 0):
            raise UsageError("--pool: not with --executor ray (each node makes its own sandboxes); give --pool off")
        if self.rollout.reset == "restore":  # refused up front, never a harness error per attempt
            from drumsbench.envs.base import RestoringReset

            kind = suites.KINDS.load(suites.suite_kind(self.tasks))
            if not issubclass(kind.environment_class(), RestoringReset):
                raise UsageError(f"--reset restore: the {kind.name} environment cannot reset by restoring a "
                                 "checkpoint; use in_place or recreate")
        return self

    def pool_size(self) -> int:
        """Idle sandboxes of this run's warm pool (0: none; never with Ray, nor for an environment
        whose tasks bring their own images: the pool's sandboxes are of the substrate's image)."""
        if self.executor == "ray" or issubclass(suites.KINDS.load(suites.suite_kind(self.tasks)).environment_class(),
                                                TaskImages):
            return 0
        return pool_size(self.pool, self.concurrency)


def new_run_id() -> str:
    return datetime.now(UTC).strftime("r%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


def ledger_path(out: Path) -> Path:
    return out / "ledger.sqlite"


def open_ledger(out: Path) -> Ledger:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} is a file; give a folder")
    try:
        if not out.exists():  # a new out folder is its owner's alone (the ledger's, the artifacts')
            out.mkdir(parents=True, mode=0o700, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out: cannot create {out} ({e.strerror}); choose a writable folder") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"--out: {out} is not writable; choose a writable folder")
    return Ledger(ledger_path(out))


def make_substrate(name: str, run_id: str, tasks: str | None = None) -> Substrate:
    """The substrate ``name`` for ``run_id``; a one-line ``UsageError`` when it is not ready here, or
    when the environment of suite ``tasks`` needs what its sandboxes cannot do (checked before any
    sandbox is made, never turned into invalid attempts)."""
    cls = registry.get(name)
    flavor = "base"
    if tasks is not None:  # first: what the environment needs does not depend on this host
        kind = suites.KINDS.load(suites.suite_kind(tasks))
        env_class = kind.environment_class()
        flavor = env_class.image_flavor
        unmet = env_class.unmet(cls.sandbox_class)
        problem = images_problem(env_class, name)
        if problem:
            raise UsageError(problem)
        if unmet:
            fit = [n for n in registry.BUILTINS if _fits(env_class, n)]
            raise UsageError(f"--substrate {name}: the {kind.name} environment needs sandboxes that are "
                             f"{' and '.join(unmet)}; {name}'s are not (choose {', '.join(fit) or 'a plugin'})")
    missing = cls.missing()
    if missing:
        raise UsageError(f"--substrate {name}: not ready here: {missing}")
    substrate = with_flavor(cls(run_id, state.state_dir()), flavor)
    if tasks is not None:
        folder = suites.suite_folder(tasks)
        substrate.hide(folder)  # its answer keys (``core.answer_keys``)
        exposed = substrate.answer_keys_exposed()
        if exposed:
            substrate.close()
            key = next(iter(sorted(folder.glob("*/golden.patch")) or sorted(folder.glob("*/hidden"))), folder)
            raise UsageError(f"--substrate {name}: {exposed}, so a sandbox could read the answer key {key}; "
                             f"run as root or choose another substrate")
    return substrate


def images_problem(env_class: type[Environment], name: str) -> str | None:
    """Why substrate ``name`` cannot run ``env_class``'s tasks when each brings its own image
    (``TaskImages``: the substrate must build them, ``RecipeImages``), or None."""
    if not issubclass(env_class, TaskImages) or name in registry.having(RecipeImages, among=[name]):
        return None
    fit = registry.having(RecipeImages)  # loads every substrate's module: only on the way to an error
    return (f"--substrate {name}: the {env_class.kind} environment runs each task in its own image, which {name} "
            f"cannot build (choose {', '.join(fit) or 'a plugin'})")


def _fits(env_class: type[Environment], name: str) -> bool:
    """Do built-in substrate ``name``'s sandboxes have what ``env_class`` needs (False when its module
    cannot be loaded here)?"""
    try:
        sandbox_class = registry.get(name).sandbox_class
    except Exception:  # an optional dependency missing: not a fit here
        return False
    return sandbox_class is not None and not env_class.unmet(sandbox_class)


class Progress:
    """Counts for the live display."""

    def __init__(self, already: Counter[str] | None = None) -> None:
        self.counts: Counter[str] = Counter(already or {})
        self.started = time.monotonic()

    def add(self, rec: AttemptRecord) -> None:
        self.counts[rec.outcome.value] += 1
        if rec.cause:
            self.counts[rec.cause.value] += 1


def check_policy(cfg: RunConfig, kind: str) -> None:
    """``UsageError`` unless ``cfg.policy`` names a policy, with a good argument, that can act in
    environment kind ``kind`` (``Policy.unsupported``)."""
    problem = make_policy(cfg.policy, cfg.noisy_p, cfg.explorer_steps).unsupported(kind)
    if problem:
        raise UsageError(problem)


def execute(ledger: Ledger, run_id: str, cfg: RunConfig, resume: bool,
            on_progress: Callable[[Progress], None] | None = None) -> tuple[str, Progress]:
    """Run (or continue) ``run_id`` until its end; returns (final status, progress counts).

    With ``cfg.window`` set, this runs one *window* of a multi-window run (a sweep, a projection):
    sequence numbers continue after the run's last attempt, the duration and attempt limits apply to
    this window alone, the run's status is left to the caller, and a ``segment`` artifact records
    when work started, its deadline, when it ended, whether it was interrupted, the window's
    configuration and the host resources sampled during it (``measure.windows``).
    """
    suite = suites.load(cfg.tasks)
    faults = FaultPlan.parse(cfg.inject, seed=cfg.seed)
    check_policy(cfg, suite.kind)  # before anything starts
    substrate = make_substrate(cfg.substrate, run_id, cfg.tasks)

    windowed = bool(cfg.window)
    already = ledger.count(run_id) if resume and not windowed else 0
    first_seq = ledger.next_seq(run_id) if resume or windowed else 0
    used_s = sum(e - s for s, e, _ in ledger.segments(run_id)) if resume and not windowed else 0.0
    duration_left = None if cfg.duration_s is None else cfg.duration_s - used_s
    attempts_left = None if cfg.max_attempts is None else cfg.max_attempts - already
    if (duration_left is not None and duration_left <= 0) or (attempts_left is not None and attempts_left <= 0):
        ledger.set_status(run_id, "complete")
        return "complete", Progress()

    state.register(run_id, [cfg.substrate], ledger.path)
    seg = ledger.start_segment(run_id, os.getpid(), cfg.window)
    progress = Progress()
    pool_started = time.time()
    if cfg.pool_size():  # registered first: a crash now leaves pooled sandboxes that gc can find
        substrate = start_pool(substrate, cfg.pool_size())
    try:
        control = positive_control(substrate)
        ledger.record_control(run_id, cfg.window, "isolation", control.fired, control.detail)
        work_started = time.time()
        deadline = None if duration_left is None else time.monotonic() + duration_left
        max_seq = None if attempts_left is None else first_seq + attempts_left
        out_dir = ledger.path.parent

        def make_env() -> Environment:
            env = suite.make_env()
            env.artifact_dir = out_dir  # screenshots go beside the ledger (the run's --out)
            return env

        job = Job(run_id=run_id, tasks=list(suite.tasks),
                  make_policy=lambda: make_policy(cfg.policy, cfg.noisy_p, cfg.explorer_steps),
                  make_env=make_env, rollout=cfg.rollout, faults=faults, seed=cfg.seed,
                  first_seq=first_seq, max_seq=max_seq, deadline=deadline,
                  meta={"window": cfg.window})
        executor: LocalExecutor | RayExecutor
        ready: list[float] = []  # when the executor was connected and set up (Ray)

        def on_ready(setup_s: float) -> None:
            """Set-up is not work: the deadline moves by it, and work starts now."""
            if job.deadline is not None:
                job.deadline += setup_s
            ready.append(time.time())

        live: Callable[[], int] = lambda: len(job._live)  # noqa: E731
        if cfg.executor == "ray":
            from drumsbench.executors.ray import RayExecutor

            executor = RayExecutor(cfg.concurrency, cfg.ray_address, on_ready=on_ready, on_control=lambda fired,
                                   detail: ledger.record_control(run_id, cfg.window, "isolation", fired, detail))
            live = executor.live_sandboxes  # the sandboxes live in the nodes' actors
        else:
            executor = LocalExecutor(cfg.concurrency)

        refused: list[str] = []

        def sink(rec: AttemptRecord) -> None:
            if refused:
                return
            try:
                ledger.record(rec, seg)
            except sqlite3.OperationalError as e:  # a full disk: stop; what was recorded stays intact
                refused.append(f"seq {rec.seq}: {e}")
                job.stopped.set()  # no more work; in-flight attempts are dropped like on Ctrl-C
                return
            progress.add(rec)

        tick = (lambda: on_progress(progress)) if on_progress else None
        sampler = ResourceSampler(live, duration_left).start() if windowed else None
        watcher = (LeakSampler(cfg.substrate, duration_left, run_id=run_id).start()
                   if cfg.watch and not windowed else None)
        try:
            executor.execute(job, substrate, sink, tick)
        finally:
            if watcher is not None:  # name: the segment (a resumed run has one per start)
                with contextlib.suppress(sqlite3.OperationalError):
                    artifacts.put(ledger, run_id, f"{WATCH_PREFIX}{seg}", watcher.stop())
        if refused:
            raise LedgerUnwritable(f"the ledger refused attempt {refused[0]}; the {ledger.count(run_id)} attempts "
                                   f"recorded are intact; make room, then `drumsbench run --resume {run_id}`")
        ledger.heartbeat(run_id, seg)
        register_screenshots(ledger, run_id)
        status = "interrupted" if executor.interrupted else "complete"
        if sampler is not None:
            artifacts.put(ledger, run_id, cfg.window, artifacts.SegmentArtifact(
                concurrency=cfg.concurrency, planned_s=duration_left, max_attempts=attempts_left,
                work_started=ready[0] if ready else work_started, ended=time.time(), interrupted=executor.interrupted,
                config=cfg.model_dump(mode="json", exclude={"price"}), resources=sampler.stop()))
        else:
            ledger.set_status(run_id, status)
        return status, progress
    finally:
        substrate.close()
        if isinstance(substrate, PooledSubstrate):
            use = substrate.pool.use().model_copy(update={"wall_s": time.time() - pool_started})
            # a full disk already stopped the run (LedgerUnwritable says so); the pool's use is then lost
            with contextlib.suppress(sqlite3.OperationalError):
                ledger.put_artifact(run_id, POOL_KIND, cfg.window or "run", use.model_dump(mode="json"))
        state.unregister(run_id)


WATCH_PREFIX = "run-segment-"  # names of a watched run's ``leaks`` artifacts
FILL_WAIT_S = 120.0  # the first fill is awaited at most this long before work starts


def start_pool(substrate: Substrate, size: int) -> PooledSubstrate:
    """``substrate`` behind a warm pool of ``size``, filled before work starts (bounded by
    ``FILL_WAIT_S``); the memory its idle sandboxes hold is measured across the first fill."""
    before = mem_kib("MemAvailable")
    sub = pooled(substrate, size)
    full = sub.pool.wait_full(FILL_WAIT_S)
    after = mem_kib("MemAvailable")
    if full:
        sub.pool.u.idle_mib_each = (before - after) / 1024 / size
    sub.pool.u.host_mem_mib = mem_kib("MemTotal") / 1024
    return sub


def mem_kib(field: str) -> int:
    """A ``/proc/meminfo`` field in KiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/meminfo")


SCREEN_STAGES = ("start", "middle", "end")


def register_screenshots(ledger: Ledger, run_id: str) -> int:
    """Record the screenshots the environments kept beside the ledger
    (``screenshots/<run>/<task>/<stage>.png``) as ``screenshot`` artifacts with paths relative to the
    ledger's folder, so the HTML report shows them. Returns how many were recorded."""
    base = ledger.path.parent
    root = base / "screenshots" / run_id
    if not root.is_dir():
        return 0
    n = 0
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for stage in SCREEN_STAGES:
            png = task_dir / f"{stage}.png"
            if png.is_file() and not png.is_symlink():
                artifacts.put(ledger, run_id, f"{task_dir.name}/{stage}", artifacts.ScreenshotArtifact(
                    task=task_dir.name, stage=stage, path=str(png.relative_to(base))))
                n += 1
    return n
