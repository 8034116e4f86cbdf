"""Per-attempt scheduling overhead: the Ray executor vs the in-process one, side by side in one run.

    .venv/bin/python benchmarks/ray_overhead.py [--attempts 60] [--rounds 3] [--concurrency 1]
                                                [--tasks tests/data/mini] [--policy null]

The overhead of an executor is the **gap** on a worker between one attempt's end and the next
attempt's start (both stamped by ``run_attempt`` itself): the record's way back to the driver,
the sink, handing out the next ``Work`` and getting it to the worker. It does not depend on what
the attempt does, so a short real attempt is used (the null policy on the one-task mini suite on
the ``process`` substrate). Each round runs ``attempts`` attempts in process, then the same on Ray
(a single-node Ray of this process's own, on loopback, started once); rounds alternate so drift
of the machine hits both. Per-run fixed costs (Ray start, node actors and their setup) are
printed apart, never folded into the per-attempt figure.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs import suites
from drumsbench.executors.base import Job
from drumsbench.executors.local import LocalExecutor
from drumsbench.measure.stats import quantile
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig
from drumsbench.rollout.faults import FaultPlan
from drumsbench.substrates import registry

ROOT = Path(__file__).resolve().parents[1]


def gaps_ms(recs: list[AttemptRecord]) -> list[float]:
    """Start of each attempt minus the end of the previous one on the same worker, in ms."""
    by_worker: dict[int, list[AttemptRecord]] = {}
    for r in recs:
        by_worker.setdefault(r.worker, []).append(r)
    out = []
    for rs in by_worker.values():
        rs.sort(key=lambda r: r.t_start)
        out += [(b.t_start - a.t_end) * 1000 for a, b in itertools.pairwise(rs)]
    return out


def one(executor, args, state: Path, round_no: int) -> tuple[list[float], float, float]:
    """Run ``args.attempts`` attempts; returns (gaps in ms, wall s, mean attempt s)."""
    suite = suites.load(args.tasks)
    run_id = f"bench-{executor.name}-{round_no}-{os.getpid()}"
    substrate = registry.get("process")(run_id, state)
    job = Job(run_id=run_id, tasks=list(suite.tasks), make_policy=lambda: make_policy(args.policy),
              make_env=suite.make_env, rollout=RolloutConfig(), faults=FaultPlan(), seed=0, first_seq=0,
              max_seq=args.attempts, deadline=None)
    recs: list[AttemptRecord] = []
    t0 = time.perf_counter()
    try:
        executor.execute(job, substrate, recs.append)
    finally:
        substrate.close()
    wall = time.perf_counter() - t0
    assert len(recs) == args.attempts and sorted(r.seq for r in recs) == list(range(args.attempts))
    bad = [r for r in recs if r.outcome is Outcome.INVALID]
    assert not bad, bad[0].detail
    return gaps_ms(recs), wall, statistics.fmean(r.total_s for r in recs)


def raw_round_trip_ms(ray, concurrency: int, n: int = 300) -> list[float]:
    """Ray's own floor: sequential no-op calls to an actor shaped like the executor's."""

    @ray.remote(num_cpus=0, max_concurrency=concurrency + 2)
    class Echo:
        def ping(self, x: int) -> int:
            return x

    actor = Echo.remote()
    ray.get(actor.ping.remote(0))
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        ray.get(actor.ping.remote(i))
        out.append((time.perf_counter() - t0) * 1000)
    ray.kill(actor)
    return out


def fmt(e) -> str:
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--attempts", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1, help="attempts at once (per node on Ray)")
    ap.add_argument("--tasks", default=str(ROOT / "tests" / "data" / "mini"))
    ap.add_argument("--policy", default="null")
    args = ap.parse_args()

    from drumsbench.executors.ray import RayExecutor, connect

    state = Path(tempfile.mkdtemp(prefix="drumsbench-rayb-"))
    t0 = time.perf_counter()
    ray, disconnect = connect(None)
    ray_start = time.perf_counter() - t0
    events: list[str] = []
    gaps: dict[str, list[float]] = {"local": [], "ray": []}
    medians: dict[str, list[float]] = {"local": [], "ray": []}
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    setups: list[float] = []
    attempt_s: list[float] = []
    try:
        nodes = sum(1 for n in ray.nodes() if n["Alive"])
        for r in range(args.rounds):
            for name in ("local", "ray"):
                ex = LocalExecutor(args.concurrency) if name == "local" else \
                    RayExecutor(args.concurrency, on_event=events.append)
                g, wall, mean_attempt = one(ex, args, state, r)
                gaps[name] += g
                medians[name].append(statistics.median(g))
                walls[name].append(wall - (ex.setup_s if name == "ray" else 0.0))
                attempt_s.append(mean_attempt)
                if name == "ray":
                    setups.append(ex.setup_s)
        raw = raw_round_trip_ms(ray, args.concurrency)
    finally:
        disconnect()
        shutil.rmtree(state, ignore_errors=True)
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = "?"

    print(f"ray_overhead: {args.rounds} rounds x {args.attempts} attempts per executor, concurrency "
          f"{args.concurrency}, policy {args.policy} on {Path(args.tasks).name} (process substrate); "
          f"Ray {ray.__version__}, {nodes} node(s) on loopback")
    print(f"machine: {os.cpu_count()} cores, {platform.platform()}, python {sys.version.split()[0]}, commit {rev}, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"attempt itself: mean {statistics.fmean(attempt_s) * 1000:.1f} ms")
    print("\nper-attempt scheduling gap (end of one attempt -> start of the next on the same worker), ms:")
    print(f"{'executor':10} {'n':>5} {'p50 [95% CI]':>26} {'p95':>9} {'mean':>9}   round medians")
    for name in ("local", "ray"):
        arr = np.asarray(gaps[name])
        print(f"{name:10} {len(arr):5d} {fmt(quantile(arr, 0.5)):>26} {np.quantile(arr, 0.95):9.3f} "
              f"{arr.mean():9.3f}   {', '.join(f'{m:.3f}' for m in medians[name])}")
    diff = [b - a for a, b in zip(medians["local"], medians["ray"], strict=True)]
    ratio = [b / a for a, b in zip(medians["local"], medians["ray"], strict=True) if a > 0]
    print(f"\nray - local, per attempt: {statistics.median(diff):.3f} ms (rounds: {min(diff):.3f} .. {max(diff):.3f})")
    if ratio:
        print(f"ray / local, per attempt: {statistics.median(ratio):.1f}x "
              f"(rounds: {min(ratio):.1f} .. {max(ratio):.1f})")
    per_att = {k: [w / args.attempts * 1000 for w in v] for k, v in walls.items()}
    print(f"wall per attempt (excl. Ray node setup), ms: local {statistics.median(per_att['local']):.2f}, "
          f"ray {statistics.median(per_att['ray']):.2f}")
    print(f"fixed per run: Ray start {ray_start:.2f} s (once); node actors + setup (positive control) "
          f"{statistics.median(setups):.2f} s median ({min(setups):.2f} .. {max(setups):.2f})")
    print(f"for scale: a no-op call to a threaded actor (max_concurrency {args.concurrency + 2}) and back: "
          f"p50 {np.median(raw):.3f} ms, p95 {np.quantile(raw, 0.95):.3f} ms (n={len(raw)})")
    for line in events:
        print(f"event: {line}")


if __name__ == "__main__":
    main()
