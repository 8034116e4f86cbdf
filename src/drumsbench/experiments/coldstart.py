"""``drumsbench coldstart``: substrates side by side — create-to-first-command, teardown, memory
per idle sandbox, reset per strategy, and each substrate's raw floor measured in the same run.

Modes: ``sequential`` (one sandbox at a time), ``staggered`` (one started every ``stagger_s``,
overlapping), ``burst`` (all ``n`` at once). The raw floor runs in the same mode, so the ratio
create-to-first-command / floor compares like with like.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from drumsbench.core.errors import UsageError
from drumsbench.measure.artifacts import ColdstartArtifact, Latency, latency
from drumsbench.measure.stats import wilson
from drumsbench.substrates.base import ResetStrategy, Substrate


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


SubstrateColdstart = ColdstartArtifact  # the typed artifact is the result (measure/artifacts.py)


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


def _mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


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


def measure(sub: Substrate, cfg: ColdstartConfig, start_files: dict[str, bytes],
            say: Callable[[str], None] = lambda _m: None) -> SubstrateColdstart:
    errors: list[str] = []

    def cycle() -> tuple[float, float]:
        t0 = time.monotonic()
        box = sub.create()
        try:
            res = box.exec("true", timeout=60)
            first = time.monotonic() - t0
            if res.exit_code != 0:
                raise RuntimeError(f"`true` exited {res.exit_code}")
        finally:
            t1 = time.monotonic()
            box.destroy()
        return first, time.monotonic() - t1

    say(f"{sub.name}: {cfg.n} x create + first command ({cfg.mode})")
    samples = _run_mode(cfg.mode, cfg.n, cfg.stagger_s, cycle)
    ok = [s for s in samples if isinstance(s, tuple)]
    errors += sorted({f"{type(s).__name__}: {s}"[:200] for s in samples if isinstance(s, Exception)})

    floor_argv = sub.raw_floor()
    floor = None
    if floor_argv:
        say(f"{sub.name}: {cfg.n} x raw floor `{' '.join(floor_argv)}`")

        def floor_once() -> float:
            t0 = time.monotonic()
            subprocess.run(floor_argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            return time.monotonic() - t0

        floor_samples = [s for s in _run_mode(cfg.mode, cfg.n, cfg.stagger_s, floor_once) if isinstance(s, float)]
        floor = latency(floor_samples) if floor_samples else None

    say(f"{sub.name}: memory of {cfg.idle} idle sandboxes")
    before = _mem_available_kib()
    idle = []
    try:
        for _ in range(cfg.idle):
            box = sub.create()
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
    box = sub.create()
    try:
        box.put_files(box.paths.work, start_files)
        for strategy in sub.capabilities.reset_strategies:
            times = []
            for _ in range(cfg.reset_n):
                box.write_file(f"{box.paths.work}/dirt.txt", b"changed by an episode")
                t0 = time.monotonic()
                if strategy is ResetStrategy.IN_PLACE:
                    box.reset_in_place()
                else:
                    box.destroy()
                    box = sub.create()
                box.put_files(box.paths.work, start_files)
                times.append(time.monotonic() - t0)
            resets[strategy.value] = latency(times)
    finally:
        box.destroy()

    first = latency([s[0] for s in ok])
    ratio = None
    if floor is not None and floor.p50.value and first.p50.value is not None:
        ratio = first.p50.value / floor.p50.value
    reset_ratio = None
    if {"in_place", "recreate"} <= resets.keys():
        reset_ratio = (resets["recreate"].p50.value or 0) / (resets["in_place"].p50.value or 1e-12)
    return SubstrateColdstart(
        substrate=sub.name, mode=cfg.mode.value, isolation=sub.capabilities.isolation.value,
        first_command=first, success=wilson(len(ok), len(samples)), teardown=latency([s[1] for s in ok]),
        floor_argv=floor_argv, floor=floor, ratio_to_floor=ratio, idle_memory_mib=idle_mib,
        idle_pss_mib=idle_pss, reset=resets,
        reset_ratio_recreate_over_in_place=reset_ratio, errors=errors)


def parse_substrates(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError("--substrates: give at least one substrate, e.g. process,docker")
    return names
