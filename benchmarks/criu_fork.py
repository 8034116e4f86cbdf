"""Where a CRIU continuation's time goes, and what the pool of restored continuations saves.

    .venv/bin/python benchmarks/criu_fork.py [--task calc-bold-header] [--k 5] [--forks 5] [--json out.json]

One parent (the desktop task, checkpointable, k oracle actions), then side by side in one run:
``replay`` (3 forks), ``criu-cold`` and ``criu`` (the pool restored ahead of demand) with
``--forks`` forks each, one at a time with a pause between them (an RL trainer's continuation runs
for seconds; the pause lets the pool refill, as it would). Per fork: creation (``ForkMethod.fork_cost``:
the cost of making it, restore included, wherever it was paid), the hand-over (what the caller
waited: for ``criu`` a continuation restored ahead by the pool) and the phases — sandbox provision,
image copy (``cp -a`` of the frozen folder), ``criu restore``, adopt — then the first screenshot,
the restored tree's page faults up to it, and the capture + faithfulness check against the
parent's capture. The checkpoint's own dump and folder
copy are printed too. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from drumsbench.branching.desktop_criu import CriuFork
from drumsbench.branching.methods import METHODS, ForkMethod, costed_fork
from drumsbench.core.criu import tree_pids
from drumsbench.envs import suites
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.profile import template_profile
from drumsbench.experiments.branch import BranchConfig, _pick, _prepare_parent
from drumsbench.measure.stats import quantile
from drumsbench.substrates.process import ProcessSubstrate


def faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of the tree rooted at ``pid``."""
    mn = mj = 0
    for p in tree_pids(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        mn, mj = mn + int(f[7]), mj + int(f[9])
    return mn, mj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default=None)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--forks", type=int, default=5)
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between forks (a continuation's run)")
    ap.add_argument("--state", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    template_profile()
    suite = suites.load("desktop")
    task = _pick(list(suite.tasks), args.task)
    cfg = BranchConfig(tasks="desktop", k=args.k, methods=["replay", "criu-cold", "criu"])
    load0 = os.getloadavg()
    out: dict[str, Any] = {"task": task.id, "k": args.k, "methods": {}}
    with tempfile.TemporaryDirectory(prefix="drumsbench-criu-bench-", dir=args.state) as tmp:
        sub = ProcessSubstrate("criubench", Path(tmp))
        parent = _prepare_parent(sub, suite, task, args.k, cfg)
        try:
            prepared = parent.env.capture()
            for name, n in (("replay", 3), ("criu-cold", args.forks), ("criu", args.forks)):
                method: ForkMethod = METHODS[name](sub, suite.make_env, task, task.branch_prefix(args.k), 30.0)
                t0 = time.monotonic()
                method.prepare(parent)
                rows: list[dict[str, float]] = []
                try:
                    row_prepare = time.monotonic() - t0
                    for _ in range(n):
                        time.sleep(args.pause)
                        child, cost = costed_fork(method, parent.env.generation)
                        row: dict[str, float] = {"creation_s": cost.creation_s, "handover_s": cost.handover_s}
                        try:
                            env = child.env
                            assert isinstance(env, DesktopEnv) and env.inst is not None
                            pid = env.inst.holder_pid
                            f0 = faults(pid) if pid else (0, 0)
                            t2 = time.monotonic()
                            env.inst.grab()
                            row["first_screen_s"] = time.monotonic() - t2
                            f1 = faults(pid) if pid else (0, 0)
                            row["minflt_first_screen"], row["majflt_first_screen"] = f1[0] - f0[0], f1[1] - f0[1]
                            t3 = time.monotonic()
                            dims = parent.env.compare(prepared, env.capture())
                            row["capture_s"] = time.monotonic() - t3
                            row["faithful"] = float(all(dims.values()))
                        finally:
                            child.destroy()
                        if isinstance(method, CriuFork) and method.timings:
                            row.update(method.timings[-1])
                        rows.append(row)
                        print(name, {k: round(v, 3) for k, v in row.items()}, flush=True)
                    extra = {"checkpoint": method.checkpoint_phases, "fill_errors": method.fill_errors} \
                        if isinstance(method, CriuFork) else {}
                finally:
                    method.close()
                keys = sorted({k for r in rows for k in r})
                out["methods"][name] = {
                    "prepare_s": round(row_prepare, 3), **extra,
                    "creation_p50": quantile([r["creation_s"] for r in rows], 0.5).fmt(".3f", "s"),
                    "creation_p50_s": quantile([r["creation_s"] for r in rows], 0.5).value,
                    "handover_p50": quantile([r["handover_s"] for r in rows], 0.5).fmt(".4f", "s"),
                    "faithful": f"{sum(r.get('faithful', 0) for r in rows):.0f}/{len(rows)}",
                    "median": {k: round(statistics.median(r[k] for r in rows if k in r), 4) for k in keys}}
        finally:
            parent.destroy()
            sub.close()
    load1 = os.getloadavg()
    out.update(load_before=load0, load_after=load1)
    print(f"\nload average before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, after "
          f"{load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} (2 cores); task {task.id}, k={args.k}")
    replay = out["methods"]["replay"]["creation_p50_s"]
    for name, m in out["methods"].items():
        ratio = replay / m["creation_p50_s"] if m["creation_p50_s"] else float("nan")
        print(f"{name:10s} creation p50 {m['creation_p50']} ({ratio:.1f}x replay), hand-over p50 "
              f"{m['handover_p50']}, faithful {m['faithful']}, "
              f"prepare {m['prepare_s']} s, medians {m['median']}")
        if "checkpoint" in m:
            print(f"{'':10s} checkpoint {m['checkpoint']}, pool errors {m['fill_errors']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
