"""Desktop reset strategies side by side: in_place, recreate and restore (``--reset restore``).

    .venv/bin/python benchmarks/desktop_restore.py [--tasks all] [--rounds 2] [--state DIR] [--json out.json]

On the process substrate, for every desktop task (9), interleaved task by task so that all three
strategies see the same load: ``--rounds`` x (oracle, null) attempts with each strategy, one slot
per strategy (its sandbox reused: the reset is what is timed). Per strategy it prints the reset
time (``AttemptRecord.reset_s``: sandbox reset + the environment's start, up to the verified start)
p50 with its 95% interval, oracle and null success, the share of resets that passed the start
fingerprint (gate 1), and for restore: how many resets restored, fell back to a cold start, and
the one-off cost of making each task's checkpoint (not counted in the reset times: the first
restore attempt of a task pays it). The restore's own phases (copy, criu restore, first screen,
fingerprint) are printed as medians, with the CPU seconds a restore takes (CRIU's own and the
restored tasks') beside those of a cold start (the instance's processes up to the ready screen):
CPU time does not move with the load, wall time does. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.profile import template_profile
from drumsbench.envs.desktop.task import load_suite
from drumsbench.measure.stats import quantile, wilson
from drumsbench.policies.scripted import Null, Oracle
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import ResetStrategy
from drumsbench.substrates.process import ProcessSubstrate

STRATEGIES: dict[str, ResetStrategy | str] = {
    "in_place": ResetStrategy.IN_PLACE, "recreate": ResetStrategy.RECREATE, "restore": "restore"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="all", help="comma list of task ids, or all")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--state", type=Path, default=None, help="state folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tasks = [t for t in load_suite("desktop") if args.tasks == "all" or t.id in args.tasks.split(",")]
    template_profile()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="drumsbench-restore-bench-", dir=args.state) as tmp:
        sub = ProcessSubstrate("restorebench", Path(tmp))
        slots = {name: Slot(sub, DesktopEnv()) for name in STRATEGIES}
        cfgs = {name: RolloutConfig(step_timeout_s=30, episode_timeout_s=300, reset=r)  # type: ignore[arg-type]
                for name, r in STRATEGIES.items()}
        recs: dict[str, list[AttemptRecord]] = defaultdict(list)
        cold_cpu: dict[str, list[float]] = defaultdict(list)  # CPU seconds of each cold start's instance
        seq = 0
        t0 = time.monotonic()
        try:
            for task in tasks:
                for _ in range(args.rounds):
                    for policy in (Oracle(), Null()):
                        for name in STRATEGIES:
                            rec = run_attempt(slots[name], task, policy, cfgs[name], CanaryRegistry(),
                                              run_id=sub.run_id, seq=seq, seed=0)
                            seq += 1
                            env = slots[name].env
                            if name != "restore" and isinstance(env, DesktopEnv):
                                cold_cpu[name].append(env.start_cpu_s)
                            recs[name].append(rec)
                            print(f"{task.id:22s} {name:9s} {policy.name:6s} {rec.outcome.value:8s} "
                                  f"reset {rec.reset_s:6.2f} s {rec.extra.get('reset', '')} {rec.detail[:80]}",
                                  flush=True)
        finally:
            for slot in slots.values():
                slot.destroy()
                assert isinstance(slot.env, DesktopEnv)
                slot.env.stop()
            sub.close()
        span = time.monotonic() - t0
    load1 = os.getloadavg()
    out = report(recs)
    for name, cpu in cold_cpu.items():
        out["strategies"][name]["start_cpu_p50_s"] = round(statistics.median(cpu), 3) if cpu else None
    out.update(load_before=load0, load_after=load1, span_s=span, tasks=[t.id for t in tasks], rounds=args.rounds)
    print(f"\nload average before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, after "
          f"{load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} (2 cores); {len(tasks)} tasks, {span:.0f} s")
    for name, r in out["strategies"].items():
        print(f"{name:9s} reset p50 {r['reset_p50']} (n={r['resets']}), oracle {r['oracle']}, null {r['null']}, "
              f"start fingerprint passed {r['fingerprint_passed']}, start CPU p50 {r.get('start_cpu_p50_s')} s")
    rs = out["strategies"]["restore"]
    print(f"restore: {rs['restored']} restored, {rs['cold_fallbacks']} cold fallbacks; checkpoint made per task "
          f"p50 {rs['checkpoint_made_p50_s']}; phases p50 {rs['phases_p50_s']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


def report(recs: dict[str, list[AttemptRecord]]) -> dict[str, Any]:
    strategies: dict[str, Any] = {}
    for name, rs in recs.items():
        # a reset that made the task's checkpoint is not a reset by restore's steady state
        timed = [r.reset_s for r in rs if "reset_checkpoint_made_s" not in r.extra]
        oracle = [r for r in rs if r.policy == "oracle"]
        null = [r for r in rs if r.policy == "null"]
        passed = [r.cause is not InvalidCause.DIRTY_RESET for r in rs]
        row: dict[str, Any] = {
            "resets": len(timed), "reset_p50": quantile(timed, 0.5).fmt(".3f", "s"),
            "reset_p50_s": quantile(timed, 0.5).value,
            "oracle": f"{sum(r.outcome is Outcome.SUCCESS for r in oracle)}/{len(oracle)}",
            "null": f"{sum(r.outcome is Outcome.SUCCESS for r in null)}/{len(null)}",
            "invalid": {str(r.cause): r.detail[:200] for r in rs if r.cause is not None},
            "fingerprint_passed": wilson(sum(passed), len(passed)).fmt(".3f"),
        }
        if name == "restore":
            row["restored"] = sum(r.extra.get("reset") == "restore" for r in rs)
            row["cold_fallbacks"] = [str(r.extra.get("reset_fallback")) for r in rs if r.extra.get("reset") == "cold"]
            made = [float(r.extra["reset_checkpoint_made_s"]) for r in rs  # type: ignore[arg-type]
                    if "reset_checkpoint_made_s" in r.extra]
            row["checkpoint_made_p50_s"] = round(statistics.median(made), 2) if made else None
            phases = ("copy_s", "criu_restore_s", "first_screen_s", "fingerprint_s", "restore_total_s",
                      "criu_cpu_s", "tree_cpu_s")
            row["phases_p50_s"] = {
                p: round(statistics.median(float(r.extra[f"reset_{p}"]) for r in rs  # type: ignore[arg-type]
                                           if f"reset_{p}" in r.extra), 3)
                for p in phases if any(f"reset_{p}" in r.extra for r in rs)}
        strategies[name] = row
    return {"strategies": strategies}


if __name__ == "__main__":
    main()
