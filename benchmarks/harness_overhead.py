"""Harness overhead per step: the rollout loop vs the raw substrate exec, side by side in one run.

    .venv/bin/python benchmarks/harness_overhead.py [--substrate process] [--steps 200] [--rounds 5]

For each round it times (a) ``steps`` raw ``sandbox.exec("true")`` calls and (b) one attempt whose
policy takes ``steps`` shell steps of ``true`` through the full rollout loop (generation check,
end-marker protocol, observation gate, timing) minus the same attempt with 0 steps. Added per step
= (b)/steps - (a)/steps. It also prints the added time as a share of a default rollout (the oracle
on the built-in suite). Targets: <= 0.5 ms per step and <= 2 % of a default rollout.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.scripted import Oracle, Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry


class TrueSteps(Policy):
    name = "true-steps"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        fix = [a for a in task.oracle_plan() if a.kind == "patch"]
        return [ActionSpec("shell", {"command": "true"})] * self.n + fix + [ActionSpec(SUBMIT)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--substrate", default="process")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tasks", default="coding")
    args = ap.parse_args()

    state = Path(tempfile.mkdtemp(prefix="drumsbench-bench-"))
    sub = registry.get(args.substrate)("bench", state)
    slot = Slot(sub, CodingEnv())
    cfg = RolloutConfig(step_timeout_s=30, episode_timeout_s=600)
    tasks = load_suite(args.tasks)
    canaries = CanaryRegistry()
    raw_ms, loop_ms, default_ms = [], [], []
    seq = 0
    try:
        for _ in range(args.rounds):
            box = sub.create()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                box.exec("true", timeout=30)
            raw_ms.append((time.perf_counter() - t0) / args.steps * 1000)
            box.destroy()

            def attempt(policy: Policy) -> float:
                nonlocal seq
                seq += 1
                rec = run_attempt(slot, tasks[0], policy, cfg, canaries, run_id="bench", seq=seq, seed=0)
                assert rec.outcome is Outcome.SUCCESS, rec.detail
                return rec.total_s

            with_steps = attempt(TrueSteps(args.steps))
            without = attempt(TrueSteps(0))
            loop_ms.append((with_steps - without) / args.steps * 1000)
            default_ms.append(statistics.mean(attempt(Oracle()) for _ in range(5)) * 1000)
    finally:
        slot.destroy()
        sub.close()
        shutil.rmtree(state, ignore_errors=True)  # nothing of the benchmark stays in /tmp

    raw, loop, default = statistics.median(raw_ms), statistics.median(loop_ms), statistics.median(default_ms)
    added = loop - raw
    steps_in_default = len(tasks[0].oracle_plan()) - 1 + 1  # actions + the first observation
    share = added * steps_in_default / default
    spread = lambda xs: f"{min(xs):.3f}-{max(xs):.3f}"  # noqa: E731
    print(f"substrate {args.substrate}, {args.rounds} rounds x {args.steps} steps, median (min-max over rounds)")
    print(f"raw exec of `true`:            {raw:.3f} ms/step ({spread(raw_ms)})")
    print(f"through the rollout loop:      {loop:.3f} ms/step ({spread(loop_ms)})")
    print(f"added by the harness:          {added:.3f} ms/step (target <= 0.5)")
    print(f"ratio loop / raw:              {loop / raw:.3f}")
    print(f"default rollout (oracle):      {default:.1f} ms wall, {steps_in_default} steps")
    print(f"added share of a default rollout: {share * 100:.2f} % (target <= 2 %)")


if __name__ == "__main__":
    main()
