"""Where the desktop's faithfulness capture (``DesktopEnv.capture``) spends its time, and what
running the UNO query while the screen settles saves.

    .venv/bin/python benchmarks/desktop_capture.py [--task calc-bold-header] [--k 3] [-n 8]

One prepared parent (the desktop task on the process substrate, k oracle actions); then ``-n``
captures each way, alternating (so both see the same load): ``serial`` (the UNO query, then the
screen's settle) and ``overlap`` (the query in a thread while the screen settles, the default).
Per capture: the phases (``capture_phases``: staging the runner, the UNO query, the settle, the
lock files, the PNG) and whether it compares equal to the first capture on every dimension.
Prints medians with 95% order-statistics intervals and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from drumsbench.envs import suites
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.profile import template_profile
from drumsbench.experiments.branch import BranchConfig, _pick, _prepare_parent
from drumsbench.measure.stats import quantile
from drumsbench.substrates.process import ProcessSubstrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default=None)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("-n", type=int, default=8, help="captures each way")
    ap.add_argument("--state", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    template_profile()
    suite = suites.load("desktop")
    task = _pick(list(suite.tasks), args.task)
    cfg = BranchConfig(tasks="desktop", k=args.k, methods=["replay"])
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, float]]] = {"serial": [], "overlap": []}
    with tempfile.TemporaryDirectory(prefix="drumsbench-capture-bench-", dir=args.state) as tmp:
        sub = ProcessSubstrate("capturebench", Path(tmp))
        parent = _prepare_parent(sub, suite, task, args.k, cfg)
        try:
            env = parent.env
            assert isinstance(env, DesktopEnv)
            first = env.capture()
            for _ in range(args.n):
                for way in ("serial", "overlap"):
                    env.capture_overlap = way == "overlap"
                    now = env.capture()
                    row = dict(env.capture_phases)
                    row["faithful"] = float(all(env.compare(first, now).values()))
                    rows[way].append(row)
                    print(way, {k: round(v, 3) for k, v in row.items()}, flush=True)
        finally:
            parent.destroy()
            sub.close()
    load1 = os.getloadavg()
    out: dict[str, Any] = {"task": task.id, "k": args.k, "n": args.n, "load_before": load0, "load_after": load1}
    print(f"\nload average before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, after "
          f"{load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} ({os.cpu_count()} cores); task {task.id}, k={args.k}, "
          f"{args.n} captures each way, medians [95% interval]")
    for way, rs in rows.items():
        keys = [k for k in rs[0] if k != "faithful"]
        med = {k: quantile([r[k] for r in rs], 0.5) for k in keys}
        out[way] = {k: e.model_dump() for k, e in med.items()} | {"faithful": sum(r["faithful"] for r in rs)}
        print(f"{way:8s} " + ", ".join(f"{k} {e.fmt('.3f')}" for k, e in med.items()) +
              f"; faithful {sum(r['faithful'] for r in rs):.0f}/{len(rs)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
