"""``drumsbench coldstart``: substrates side by side — create-to-first-command, teardown, memory
per idle sandbox, reset per strategy, and each substrate's raw floor measured in the same run.

Modes: ``sequential`` (one sandbox at a time), ``staggered`` (one started every ``stagger_s``,
overlapping), ``burst`` (all ``n`` at once). The raw floor runs in the same mode, so the ratio
create-to-first-command / floor compares like with like.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from drumsbench.envs.desktop.task import DesktopTask

from drumsbench.core.errors import UsageError
from drumsbench.experiments.run import mem_kib
from drumsbench.measure.artifacts import ColdstartArtifact, DesktopColdstartArtifact, Latency, latency
from drumsbench.measure.cost import DEFAULT_PRICE, HostPrice, pool_cost
from drumsbench.measure.pool import PoolColdstartArtifact
from drumsbench.measure.stats import Estimate, wilson
from drumsbench.rollout.pool import PoolSetting, WarmPool, pool_size
from drumsbench.substrates.base import RecipeImages, ResetStrategy, Sandbox, Substrate


class Mode(StrEnum):
    SEQUENTIAL = "sequential"
    STAGGERED = "staggered"
    BURST = "burst"


class ColdstartConfig(BaseModel):
    substrates: list[str] = Field(min_length=1)
    mode: Mode = Mode.SEQUENTIAL
    n: int = Field(100, ge=1, le=10_000)
    stagger_s: float = Field(0.05, gt=0)
    idle: int = Field(8, ge=1, le=200)
    reset_n: int = Field(10, ge=1)
    pool: PoolSetting = "auto"  # warm pool measured beside create: auto = number of cores; 0 = not measured

    def pool_size(self) -> int:
        return pool_size(self.pool, os.cpu_count() or 1)


SubstrateColdstart = ColdstartArtifact  # the typed artifact is the result (measure/artifacts.py)


def reset_by(strategy: ResetStrategy, box: Sandbox, sub: Substrate,
             create: Callable[[], Sandbox] | None = None) -> Sandbox:
    """The sandbox after one reset by ``strategy``: the same one emptied in place, or a fresh one
    (the old one destroyed; ``create``, else ``sub.create``)."""
    if strategy is ResetStrategy.IN_PLACE:
        box.reset_in_place()
        return box
    box.destroy()
    return (create or sub.create)()


def _run_mode(mode: Mode, n: int, stagger_s: float, one: Callable[[], Any]) -> list[Any]:
    """Call ``one`` n times in the given mode; results in start order (an exception is a result)."""
    results: list[Any] = [None] * n

    def call(i: int) -> None:
        try:
            results[i] = one()
        except Exception as e:
            results[i] = e

    if mode is Mode.SEQUENTIAL:
        for i in range(n):
            call(i)
        return results
    threads = []
    barrier = threading.Barrier(n) if mode is Mode.BURST else None
    for i in range(n):
        def run(i: int = i) -> None:
            if barrier is not None:
                barrier.wait()
            call(i)
        t = threading.Thread(target=run, daemon=True)
        threads.append(t)
        t.start()
        if mode is Mode.STAGGERED:
            time.sleep(stagger_s)
    for t in threads:
        t.join()
    return results


def _mem_available_kib(field: str = "MemAvailable") -> int:
    return mem_kib(field)


def _labelled_pss_kib(run_id: str) -> int | None:
    """Proportional set size of every host process labelled with ``run_id`` (None: none labelled)."""
    from drumsbench.substrates.hostproc import pids_with_env

    total, found = 0, False
    for pid in pids_with_env("DRUMSBENCH_RUN", run_id):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        found = True
                        break
        except OSError:
            continue
    return total if found else None


def _first_command(get: Callable[[], Sandbox]) -> tuple[float, float, float]:
    """Get a sandbox, run ``true`` in it, destroy it: (got, first command returned, teardown) in s."""
    t0 = time.monotonic()
    box = get()
    got = time.monotonic() - t0
    try:
        res = box.exec("true", timeout=60)
        first = time.monotonic() - t0
        if res.exit_code != 0:
            raise RuntimeError(f"`true` exited {res.exit_code}")
    finally:
        t1 = time.monotonic()
        box.destroy()
    return got, first, time.monotonic() - t1


def measure(sub: Substrate, cfg: ColdstartConfig, start_files: dict[str, bytes],
            say: Callable[[str], None] = lambda _m: None, image: str | None = None) -> SubstrateColdstart:
    """The figures of ``sub``'s own sandboxes, or with ``image`` (a task image ``build_recipe``
    returned: ``RecipeImages``) of sandboxes of that image, beside its floor (``raw_floor_of``), and
    reset only by recreating (a task image's whole file system is its start state)."""
    create: Callable[[], Sandbox] = sub.create
    strategies = sub.capabilities.reset_strategies
    if image is not None:
        if not isinstance(sub, RecipeImages):
            raise UsageError(f"--substrate {sub.name}: it cannot run task images (RecipeImages)")
        recipe_images = sub

        def create() -> Sandbox:
            return recipe_images.create_from_image(image)

        strategies = tuple(s for s in strategies if s is ResetStrategy.RECREATE)

    def cycle() -> tuple[float, float]:
        _, first, teardown = _first_command(create)
        return first, teardown

    say(f"{sub.name}: {cfg.n} x create + first command ({cfg.mode})")
    ok, errors, success = _sampled(cfg, cycle)

    floor_argv, floor = _raw_floor(sub, cfg, say, image)

    say(f"{sub.name}: memory of {cfg.idle} idle sandboxes")
    before = _mem_available_kib()
    idle = []
    try:
        for _ in range(cfg.idle):
            box = create()
            idle.append(box)
            box.exec("true", timeout=60)
        time.sleep(0.5)
        idle_mib = (before - _mem_available_kib()) / 1024 / cfg.idle
        pss = _labelled_pss_kib(sub.run_id)
        idle_pss = None if pss is None else pss / 1024 / cfg.idle
    finally:
        for box in idle:
            box.destroy()

    say(f"{sub.name}: reset per strategy")
    resets: dict[str, Latency] = {}
    box = create()
    try:
        box.put_files(box.paths.work, start_files)
        for strategy in strategies:
            times = []
            for _ in range(cfg.reset_n):
                box.write_file(f"{box.paths.work}/dirt.txt", b"changed by an episode")
                t0 = time.monotonic()
                box = reset_by(strategy, box, sub, create)
                box.put_files(box.paths.work, start_files)
                times.append(time.monotonic() - t0)
            resets[strategy.value] = latency(times)
    finally:
        box.destroy()

    first = latency([s[0] for s in ok])
    reset_ratio = None
    if {"in_place", "recreate"} <= resets.keys():
        reset_ratio = (resets["recreate"].p50.value or 0) / (resets["in_place"].p50.value or 1e-12)
    return SubstrateColdstart(
        substrate=sub.name, mode=cfg.mode.value, isolation=sub.capabilities.isolation.value,
        first_command=first, success=success, teardown=latency([s[1] for s in ok]),
        floor_argv=floor_argv, floor=floor, ratio_to_floor=_ratio(first, floor), idle_memory_mib=idle_mib,
        idle_pss_mib=idle_pss, reset=resets,
        reset_ratio_recreate_over_in_place=reset_ratio, errors=errors)


def _sampled(cfg: ColdstartConfig,
             one: Callable[[], tuple[float, float]]) -> tuple[list[tuple[float, float]], list[str], Estimate]:
    """``one`` ``cfg.n`` times in ``cfg.mode``: the samples of the runs that succeeded, the distinct
    errors of the others, and the success rate."""
    samples = _run_mode(cfg.mode, cfg.n, cfg.stagger_s, one)
    ok = [s for s in samples if isinstance(s, tuple)]
    errors = sorted({f"{type(s).__name__}: {s}"[:200] for s in samples if isinstance(s, Exception)})
    return ok, errors, wilson(len(ok), len(samples))


def _ratio(first: Latency, floor: Latency | None) -> float | None:
    """p50 over the raw floor's p50 (None without a floor)."""
    if floor is not None and floor.p50.value and first.p50.value is not None:
        return first.p50.value / floor.p50.value
    return None


def _raw_floor(sub: Substrate, cfg: ColdstartConfig, say: Callable[[str], None],
               image: str | None = None) -> tuple[list[str] | None, Latency | None]:
    """The substrate's raw floor (``Substrate.raw_floor``; of task image ``image``:
    ``RecipeImages.raw_floor_of``) ``cfg.n`` times in ``cfg.mode``."""
    if image is None:
        floor_argv = sub.raw_floor()
    else:
        floor_argv = sub.raw_floor_of(image) if isinstance(sub, RecipeImages) else None
    if not floor_argv:
        return None, None
    say(f"{sub.name}: {cfg.n} x raw floor `{' '.join(floor_argv)}`")

    def floor_once() -> float:
        t0 = time.monotonic()
        subprocess.run(floor_argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        return time.monotonic() - t0

    samples = [s for s in _run_mode(cfg.mode, cfg.n, cfg.stagger_s, floor_once) if isinstance(s, float)]
    return floor_argv, (latency(samples) if samples else None)


def measure_desktop(sub: Substrate, cfg: ColdstartConfig, task: DesktopTask,
                    say: Callable[[str], None] = lambda _m: None) -> DesktopColdstartArtifact:
    """The desktop on ``sub`` (``DesktopColdstartArtifact``): ``cfg.n`` starts in ``cfg.mode``, each a
    new sandbox, a new environment and its reset on ``task`` (the path of a rollout's first
    attempt), then ``cfg.reset_n`` resets per strategy of the substrate, each from a running instance
    (the path between a rollout's attempts), and the raw floor."""
    from drumsbench.envs.desktop.env import DesktopEnv

    def start() -> tuple[float, float]:
        env = DesktopEnv()
        t0 = time.monotonic()
        box = sub.create()
        made = time.monotonic() - t0
        try:
            env.attach(box)
            env.reset(task)
            return time.monotonic() - t0, made
        finally:
            env.stop()
            box.destroy()

    say(f"{sub.name}: {cfg.n} x desktop start to the first good screenshot ({cfg.mode})")
    ok, errors, success = _sampled(cfg, start)
    floor_argv, floor = _raw_floor(sub, cfg, say)

    say(f"{sub.name}: desktop reset per strategy")
    resets: dict[str, Latency] = {}
    env = DesktopEnv()
    box = sub.create()
    try:
        env.attach(box)
        env.reset(task)
        for strategy in sub.capabilities.reset_strategies:
            times = []
            for _ in range(cfg.reset_n):
                t0 = time.monotonic()
                fresh = reset_by(strategy, box, sub)
                if fresh is not box:
                    box = fresh
                    env.attach(box)
                env.reset(task)
                times.append(time.monotonic() - t0)
            resets[strategy.value] = latency(times)
    except Exception as e:  # one failed reset: the strategies measured so far are kept, the error told
        errors.append(f"reset: {type(e).__name__}: {e}"[:200])
    finally:
        env.stop()
        box.destroy()

    first = latency([s[0] for s in ok])
    return DesktopColdstartArtifact(
        substrate=sub.name, mode=cfg.mode.value, isolation=sub.capabilities.isolation.value, task=task.id,
        start=first, create=latency([s[1] for s in ok]), success=success,
        floor_argv=floor_argv, floor=floor, ratio_to_floor=_ratio(first, floor), reset=resets, errors=errors)


FILL_WAIT_S = 120.0  # a pool that does not fill in this long is measured as it is (misses counted)


def measure_pool(sub: Substrate, cfg: ColdstartConfig, say: Callable[[str], None] = lambda _m: None,
                 price: HostPrice = DEFAULT_PRICE) -> PoolColdstartArtifact:
    """Acquire from a warm pool of ``cfg.pool_size()`` (``rollout.pool``), ``cfg.n`` times in ``cfg.mode``.

    Sequential: each acquisition waits until the pool is full again first (the pool sized to the
    demand, as in a run whose pool follows its concurrency), so it measures the warm hand-out; the
    other modes fill once and then take ``n`` as they come (hits and misses counted). Also: the
    first fill's time and memory (MemAvailable drop and labelled PSS, per sandbox), and the
    reserve's cost line (``measure.cost.pool_cost``) at ``price`` with one slot per core."""
    size = cfg.pool_size()
    errors: list[str] = []
    say(f"{sub.name}: warm pool of {size}: fill, then {cfg.n} x acquire + first command ({cfg.mode})")
    pss0 = _labelled_pss_kib(sub.run_id) or 0
    before = _mem_available_kib()
    t0 = time.monotonic()
    pool = WarmPool(sub, size)
    try:
        full = pool.wait_full(FILL_WAIT_S)
        fill_s = time.monotonic() - t0 if full else None
        time.sleep(0.5)
        idle_mib = (before - _mem_available_kib()) / 1024 / size if full else None
        pss = _labelled_pss_kib(sub.run_id)
        idle_pss = None if pss is None or not full else (pss - pss0) / 1024 / size
        pool.u.idle_mib_each = idle_mib
        pool.u.host_mem_mib = _mem_available_kib("MemTotal") / 1024
        if not full:
            errors.append(f"the pool did not fill within {FILL_WAIT_S:g} s ({pool.idle()} of {size})")

        def cycle() -> tuple[float, float]:
            if cfg.mode is Mode.SEQUENTIAL:
                pool.wait_full(FILL_WAIT_S)
            got, first, _ = _first_command(pool.acquire)
            return got, first

        samples = _run_mode(cfg.mode, cfg.n, cfg.stagger_s, cycle)
    finally:
        use = pool.close()
    ok = [s for s in samples if isinstance(s, tuple)]
    errors += sorted({f"{type(s).__name__}: {s}"[:200] for s in samples if isinstance(s, Exception)})
    errors += pool.refusals[:5]
    line, hourly = pool_cost(price, use, use.hits + use.misses, os.cpu_count() or 1)
    return PoolColdstartArtifact(
        substrate=sub.name, mode=cfg.mode.value, size=size, acquire=latency([s[0] for s in ok]),
        acquire_first_command=latency([s[1] for s in ok]), hits=use.hits, misses=use.misses, refused=use.refused,
        fill_s=fill_s, create_mean_s=use.create_s / use.created if use.created else None,
        check_mean_s=use.check_s / use.checks if use.checks else None, idle_memory_mib_each=idle_mib,
        idle_pss_mib_each=idle_pss, use=use, cost=line, usd_per_hour_held=hourly, errors=errors)


def parse_substrates(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError("--substrates: give at least one substrate, e.g. process,docker")
    return names
