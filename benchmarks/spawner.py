"""A process sandbox's command started by its spawner (born in the cgroups) or the old way (it joins
them), after a pause of 0 / 30 / 100 / 300 ms — a policy's think time — side by side in one run.

    .venv/bin/python benchmarks/spawner.py [--reps 40] [--json out.json]

Two sandboxes of one run on the ``process`` substrate (root: cgroup v1 freezer, pids and memory
groups, a uid each), one with its spawner, one without; the same command (``true``, then the
coding environment's framed shell running ``cat``) in each, interleaved, after each pause. Printed:
p50 with its 95% interval (order statistics) per pause and way, and the ratio of the p50s. A
command that joins a cgroup v1 group waits for an RCU grace period whenever no attach ran in the
last few milliseconds; one born in the group does not. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from drumsbench.envs.coding.env import _WRAP
from drumsbench.measure.stats import quantile
from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate

PAUSES_MS = (0, 30, 100, 300)
COMMANDS = {"true": ["true"], "framed cat": ["/bin/sh", "-c", _WRAP, "drumsbench", "cat f.txt", "END"]}


def measure(reps: int, state: Path) -> dict[str, Any]:
    sub = ProcessSubstrate("sp-" + uuid.uuid4().hex[:6], state)
    boxes: dict[str, ProcessSandbox] = {}
    try:
        for way in ("spawner", "joins"):
            box = sub.create()
            assert isinstance(box, ProcessSandbox)
            box.spawns_inside = way == "spawner"  # type: ignore[misc]
            box.put_files(box.paths.work, {"f.txt": b"x" * 2000})
            boxes[way] = box
        boxes["spawner"].exec(["true"], timeout=10)  # starts the spawner in the background
        deadline = time.monotonic() + 10
        while (spawner := boxes["spawner"]._spawner) is None or not spawner.usable():
            if time.monotonic() > deadline:
                raise SystemExit("the spawner did not start")
            time.sleep(0.01)
        samples: dict[tuple[str, int, str], list[float]] = {}
        load0 = os.getloadavg()
        for i in range(reps):
            for name, argv in COMMANDS.items():
                for pause in PAUSES_MS:
                    ways = ("spawner", "joins") if i % 2 == 0 else ("joins", "spawner")
                    for way in ways:
                        time.sleep(pause / 1000)
                        t0 = time.perf_counter()
                        res = boxes[way].exec(argv, timeout=10)
                        took = time.perf_counter() - t0
                        if res.exit_code != 0:
                            raise SystemExit(f"{name} failed in the {way} sandbox: {res}")
                        samples.setdefault((name, pause, way), []).append(took)
        assert spawner is not None and not spawner.failed, "the spawner failed during the run"
        out: dict[str, Any] = {"reps": reps, "loadavg_before": load0, "loadavg_after": os.getloadavg(), "rows": []}
        for name in COMMANDS:
            for pause in PAUSES_MS:
                a = quantile(samples[(name, pause, "spawner")], 0.5)
                b = quantile(samples[(name, pause, "joins")], 0.5)
                out["rows"].append({"command": name, "pause_ms": pause, "spawner_p50": a.model_dump(),
                                    "joins_p50": b.model_dump(), "ratio": (a.value or 0) / (b.value or 1)})
        return out
    finally:
        for box in boxes.values():
            box.destroy()
        sub.close()


def _ms(e: dict[str, Any]) -> str:
    return f"{e['value'] * 1e3:.2f} ms [{e['low'] * 1e3:.2f}, {e['high'] * 1e3:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40, help="commands per pause, command and way; default 40")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.reps < 6:
        ap.error("--reps: give at least 6 (a 95% interval of the median needs them)")
    with tempfile.TemporaryDirectory(prefix="spawner-bench-") as tmp:
        result = measure(args.reps, Path(tmp))
    print(f"process substrate, {args.reps} commands per cell, interleaved; load "
          f"{result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f} on {os.cpu_count()} cpus")
    print(f"{'command':12} {'pause':>6} {'spawner p50':>28} {'joins p50':>28} {'ratio':>6}")
    for row in result["rows"]:
        print(f"{row['command']:12} {row['pause_ms']:>4}ms {_ms(row['spawner_p50']):>28} "
              f"{_ms(row['joins_p50']):>28} {row['ratio']:>6.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
