"""When a desktop step ends: the quiet period (the clock) against the evidence settle, side by side.

    TMPDIR=<scratch> .venv/bin/python benchmarks/desktop_settle.py [--reps 12] [--oracle-attempts 18]
                                                                   [--json out.json]

One LibreOffice Writer instance on the process substrate. Each repetition applies a key action and
a type action (29 characters) once in each settle mode, through ``Environment.step`` (xdotool
inside the namespaces + settle + PNG encode) — the two modes alternate in order from one
repetition to the next, on the same instance, so the load of this shared host falls on both
alike. Per mode and kind: the step's p50 with its 95% interval (order statistics), the settle's own
p50, how many steps settled, how many evidence waits fell back to the quiet period, and how many
observations differed (beyond the 64-pixel tolerance) from a grab 0.7 s later — what each mode
leaves to the next observation (LibreOffice refreshes toolbar and status-bar states from a timer,
about 0.3 s after a change).

Then ``drumsbench run --tasks desktop --substrate process --policy oracle`` (the default
``Settings``: the evidence settle) and its success on every task of the suite. The load average is
printed before and after: on these 2-core machines every figure moves with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from drumsbench.envs.base import Action, ActionSpec
from drumsbench.envs.desktop import instance
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.instance import Settings
from drumsbench.envs.desktop.profile import template_profile
from drumsbench.envs.desktop.settle import frames_differ
from drumsbench.envs.desktop.task import load_suite
from drumsbench.measure.stats import quantile, wilson
from drumsbench.substrates.process import ProcessSubstrate

KEYS = ["End", "Home", "Right", "Left", "ctrl+End", "ctrl+Home"]
TEXT = "Only verified rollouts count. "[:29]
MODES = ("evidence", "quiet")
TARGET_KEY_P50_MS = 120.0


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def ms(values: list[float]) -> str:
    return quantile([v * 1000 for v in values], 0.5).fmt(".0f", "ms")


def measure_steps(reps: int, task_id: str, tmp: Path) -> dict[str, dict[str, list[dict[str, float | str | bool]]]]:
    task = next(t for t in load_suite("desktop") if t.id == task_id)
    sub = ProcessSubstrate("bench-settle", tmp)
    box = sub.create()
    env = DesktopEnv(artifact_dir=tmp / "art")
    env.attach(box)
    rows: dict[str, dict[str, list[dict[str, float | str | bool]]]] = defaultdict(lambda: defaultdict(list))
    try:
        env.reset(task)
        obs = env.observe(10)
        for rep in range(reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for kind, payload in (("key", {"keys": KEYS[rep % len(KEYS)]}), ("type", {"text": TEXT})):
                for mode in order:
                    env.settings = env.instance.settings = dataclasses.replace(env.settings, settle_mode=mode)
                    t = time.monotonic()
                    obs = env.step(Action.of(ActionSpec(kind, dict(payload)), obs.generation), 30)
                    total = time.monotonic() - t
                    report = env.instance.last_settle
                    assert report is not None and report.mode == mode
                    time.sleep(0.7)
                    later = env.instance.grab()
                    changed = frames_differ(later.rgb, obs.content["screen"]) > env.settings.settle_tolerance_px
                    rows[kind][mode].append({"total_s": total, "settle_s": report.seconds, "settled": report.settled,
                                             "fallback": report.fallback, "changed_later": bool(changed)})
    finally:
        env.stop()
        box.destroy()
        sub.close()
    return rows


def print_steps(rows: dict[str, dict[str, list[dict[str, float | str | bool]]]]) -> dict[str, float]:
    print(f"\n{'action':6} {'mode':9} {'step p50 [95% CI]':>24} {'settle p50 [95% CI]':>24} "
          f"{'settled':>8} {'fallback':>9} {'changed 0.7 s later':>20}")
    p50: dict[str, float] = {}
    for kind in ("key", "type"):
        for mode in MODES:
            r = rows[kind][mode]
            totals = [float(x["total_s"]) for x in r]
            settles = [float(x["settle_s"]) for x in r]
            p50[f"{kind}/{mode}"] = float(quantile(totals, 0.5).value or 0.0)
            print(f"{kind:6} {mode:9} {ms(totals):>24} {ms(settles):>24} "
                  f"{sum(bool(x['settled']) for x in r):>4}/{len(r):<3} {sum(bool(x['fallback']) for x in r):>9} "
                  f"{sum(bool(x['changed_later']) for x in r):>16}/{len(r):<3}")
        print(f"{kind:6} quiet / evidence, step p50: {p50[f'{kind}/quiet'] / p50[f'{kind}/evidence']:.1f}x")
    reasons = sorted({str(x["fallback"]) for k in rows for x in rows[k]["evidence"] if x["fallback"]})
    for reason in reasons:
        print(f"  fallback: {reason}")
    key_ms = p50["key/evidence"] * 1000
    print(f"key action with the evidence settle, p50 {key_ms:.0f} ms: target <= {TARGET_KEY_P50_MS:.0f} ms "
          f"{'met' if key_ms <= TARGET_KEY_P50_MS else 'NOT met'}")
    return p50


def oracle_run(attempts: int, tmp: Path) -> dict[str, object]:
    """``drumsbench run`` with the oracle on the desktop suite (default Settings: the evidence settle)."""
    out, report = tmp / "runs", tmp / "oracle.json"
    cli = Path(sys.executable).with_name("drumsbench")
    argv = [str(cli), "run", "--tasks", "desktop", "--substrate", "process", "--policy", "oracle",
            "--attempts", str(attempts), "--concurrency", "2", "--duration", "30m", "--out", str(out),
            "--json", str(report), "--no-progress"]
    print(f"\n$ {' '.join(argv[1:])}")
    t = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0 or not report.exists():
        raise SystemExit(f"drumsbench run failed (exit {res.returncode}): {res.stderr[-2000:]}")
    data: dict[str, object] = json.loads(report.read_text())
    tasks = data["tasks"]
    assert isinstance(tasks, dict)
    print(f"oracle, {data['attempts']} attempts in {time.monotonic() - t:.0f} s, settle mode "
          f"{Settings().settle_mode!r}:")
    for tid, line in sorted(tasks.items()):
        print(f"  {tid:22} success {line['success']}/{line['attempts']}  failed {line['failed']}  "
              f"invalid {line['invalid']}")
    success, valid = int(data["success"]), int(data["valid"])  # type: ignore[call-overload]
    print(f"  all: success {success}/{data['attempts']} attempts ({wilson(success, valid).fmt('.2f')} of valid), "
          f"tasks with every attempt a success: {sum(1 for v in tasks.values() if v['success'] == v['attempts'])}"
          f"/{len(tasks)}")
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=12, help="repetitions of each action in each mode")
    ap.add_argument("--task", default="writer-fix-typo", help="the document the actions are applied to")
    ap.add_argument("--oracle-attempts", type=int, default=18, help="0: skip the oracle run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    missing = instance.missing()
    if missing:
        raise SystemExit(missing)
    template_profile()
    print(f"start: {load()}")
    with tempfile.TemporaryDirectory(prefix="drumsbench-settle-bench-") as tmp:
        rows = measure_steps(args.reps, args.task, Path(tmp))
        print(f"after the steps: {load()}")
        p50 = print_steps(rows)
        oracle = oracle_run(args.oracle_attempts, Path(tmp)) if args.oracle_attempts else None
    print(f"end: {load()}")
    if args.json:
        args.json.write_text(json.dumps({"steps": rows, "p50_s": p50, "oracle_tasks": oracle and oracle["tasks"],
                                         "loadavg": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
