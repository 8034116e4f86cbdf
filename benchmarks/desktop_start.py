"""Desktop start-up and per-action latency, on the process substrate.

    .venv/bin/python benchmarks/desktop_start.py [--starts 10] [--task writer-fix-typo] [--json out.json]

Start: ``--starts`` times, a fresh instance (template profile copied, Xvfb + openbox + LibreOffice
started in new namespaces) is brought up on the task's document, and the time from the reset's
start to the first good screenshot (the document's window drawn, the screen still, the screenshot
neither black nor blank) is taken. Prints the median (target <= 2.5 s with a template profile) with
the phases: profile copy, display answering, window titled, window drawn, ready.

Actions: every action of the oracles of one Writer and one Calc task, timed through
``Environment.step`` (xdotool inside the namespaces + settle wait + PNG encode), grouped by kind;
and the parts on their own: a screenshot (grab), its PNG encoding, an xdotool call, the UNO
verifier. The machine's load average is printed: the figures move with it on a shared 2-core host.
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

from drumsbench.envs.base import SUBMIT, Action
from drumsbench.envs.desktop import instance, xcb
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.profile import template_profile
from drumsbench.envs.desktop.task import load_suite
from drumsbench.substrates.process import ProcessSubstrate


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]


def fmt(values: list[float], scale: float = 1.0, unit: str = "s") -> str:
    v = [x * scale for x in values]
    return (f"median {statistics.median(v):7.3f} {unit}  p90 {q(v, 0.9):7.3f}  min {min(v):7.3f}  "
            f"max {max(v):7.3f}  (n={len(v)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--task", default="writer-fix-typo")
    ap.add_argument("--action-tasks", default="writer-bold-word,calc-sum-formula")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    missing = instance.missing()
    if missing:
        raise SystemExit(missing)
    tasks = {t.id: t for t in load_suite("desktop")}
    t0 = time.monotonic()
    template_profile()
    print(f"template profile ready in {time.monotonic() - t0:.2f} s (cached after the first build)")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

    with tempfile.TemporaryDirectory(prefix="drumsbench-desktop-bench-") as tmp:
        sub = ProcessSubstrate("bench-desktop", Path(tmp))
        box = sub.create()
        env = DesktopEnv(artifact_dir=Path(tmp) / "art")
        env.attach(box)
        try:
            starts: list[float] = []
            phases: dict[str, list[float]] = defaultdict(list)
            task = tasks[args.task]
            for _ in range(args.starts):
                box.reset_in_place()
                t = time.monotonic()
                env.reset(task)
                obs = env.observe(10)
                elapsed = time.monotonic() - t
                problem = env.observation_problem(obs)
                if problem or env.fingerprint() != task.start_fingerprint:
                    raise SystemExit(f"start was not good: {problem or env.fingerprint_details()}")
                starts.append(elapsed)
                for k, v in env.start_phases.items():
                    phases[k].append(v)
            print(f"\nstart to first good screenshot ({args.task}), {args.starts} starts:")
            print(f"  {'total':10} {fmt(starts)}   target <= 2.5 s median: "
                  f"{'met' if statistics.median(starts) <= 2.5 else 'NOT met'}")
            for k in ("prepare", "display", "window", "drawn", "ready"):
                if phases.get(k):
                    print(f"  {k:10} {fmt(phases[k])}")

            by_kind: dict[str, list[float]] = defaultdict(list)
            grabs, pngs, xdos, verifies = [], [], [], []
            for tid in args.action_tasks.split(","):
                task = tasks[tid]
                box.reset_in_place()
                env.reset(task)
                obs = env.observe(10)
                for spec in task.oracle_plan():
                    if spec.kind == SUBMIT:
                        break
                    t = time.monotonic()
                    obs = env.step(Action.of(spec, obs.generation), 30)
                    by_kind[spec.kind].append(time.monotonic() - t)
                inst = env.instance
                for _ in range(20):
                    t = time.monotonic()
                    frame = inst.grab()
                    grabs.append(time.monotonic() - t)
                    t = time.monotonic()
                    xcb.encode_png(frame.rgb)
                    pngs.append(time.monotonic() - t)
                    t = time.monotonic()
                    inst.xdotool(["getmouselocation"], timeout=10)
                    xdos.append(time.monotonic() - t)
                env.stage_verifier(task)
                for _ in range(3):
                    t = time.monotonic()
                    assert env.run_verifier(task, 30).passed
                    verifies.append(time.monotonic() - t)
            print("\nper action, through Environment.step (xdotool + settle + PNG):")
            for kind, values in sorted(by_kind.items()):
                print(f"  {kind:10} {fmt(values, 1000, 'ms')}")
            print("parts:")
            print(f"  {'grab':10} {fmt(grabs, 1000, 'ms')}")
            print(f"  {'png':10} {fmt(pngs, 1000, 'ms')}")
            print(f"  {'xdotool':10} {fmt(xdos, 1000, 'ms')}")
            print(f"  {'verifier':10} {fmt(verifies, 1000, 'ms')}")
            print(f"load average at end: {os.getloadavg()[0]:.2f}")
            if args.json:
                args.json.write_text(json.dumps({
                    "starts_s": starts, "phases_s": phases, "actions_s": by_kind, "grab_s": grabs, "png_s": pngs,
                    "xdotool_s": xdos, "verifier_s": verifies, "loadavg": os.getloadavg()[0]}, indent=1))
        finally:
            env.stop()
            box.destroy()
            sub.close()


if __name__ == "__main__":
    main()
