"""Cold start, exec, reset and snapshot/fork of the process, bwrap and overlay substrates.

    .venv/bin/python benchmarks/ns_substrates.py [--n 30] [--state DIR]

Cold start = ``create()`` + the first ``exec("true")``, measured side by side: each round creates
one sandbox of every substrate in turn (the order rotates each round), so drift of the machine
hits all substrates alike. The overlay fork server is started before timing (its start is
reported on its own line). Figures are medians with a 95% bootstrap interval of the median.
Needs root (overlay) and bubblewrap; a missing substrate is reported and skipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drumsbench.substrates import registry
from drumsbench.substrates.base import Sandbox, Substrate
from drumsbench.substrates.overlay.sandbox import OverlaySubstrate

SUBSTRATES = ("process", "bwrap", "overlay")


def median_ci(xs: list[float], reps: int = 2000, seed: int = 1) -> tuple[float, float, float]:
    a = np.asarray(xs)
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(a, size=(reps, a.size), replace=True), axis=1)
    return float(np.median(a)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def fmt(label: str, xs: list[float]) -> str:
    m, lo, hi = median_ci(xs)
    return f"  {label:<46} {m * 1000:8.2f} ms  [{lo * 1000:.2f}, {hi * 1000:.2f}]  n={len(xs)}"


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def dirty(box: Sandbox, big_mb: int = 0) -> None:
    """A fixed amount of change: 200 small files, optionally one big file."""
    cmd = "mkdir -p d && for i in $(seq 200); do echo $i > d/f$i; done"
    if big_mb:
        cmd += f" && head -c {big_mb}M /dev/urandom > big.bin"
    res = box.exec(cmd, timeout=60)
    assert res.exit_code == 0, res.stderr


def machine() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
    except OSError:
        commit = "?"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"kernel {platform.release()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, commit {commit or '?'}, load average {load}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="rounds per measurement")
    ap.add_argument("--state", type=Path, default=None, help="state folder (default: a temp dir)")
    args = ap.parse_args()
    state = args.state or Path(tempfile.mkdtemp(prefix="drumsbench-bench-"))
    state.mkdir(parents=True, exist_ok=True)
    run_id = "bench" + uuid.uuid4().hex[:8]
    print(f"machine: {machine()}")

    subs: dict[str, Substrate] = {}
    try:  # from here on the state folder is removed whatever happens (nothing stays in /tmp)
        for name in SUBSTRATES:
            cls = registry.get(name)
            why = cls.missing()
            if why:
                print(f"  {name}: skipped ({why})")
                continue
            subs[name] = cls(run_id, state)

        if "overlay" in subs:
            t, box = timed(subs["overlay"].create)
            print(fmt("overlay first create (fork server start)", [t]))
            box.destroy()  # type: ignore[attr-defined]
        # Warm-up: one sandbox each, untimed.
        for sub in subs.values():
            b = sub.create()
            b.exec("true", timeout=10)
            b.destroy()

        cold: dict[str, list[float]] = {n: [] for n in subs}
        warm: dict[str, list[float]] = {n: [] for n in subs}
        destroy: dict[str, list[float]] = {n: [] for n in subs}
        names = list(subs)
        for i in range(args.n):
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                t0 = time.perf_counter()
                box = subs[name].create()
                res = box.exec("true", timeout=10)
                cold[name].append(time.perf_counter() - t0)
                assert res.exit_code == 0, (name, res)
                t, _ = timed(lambda b=box: b.exec("true", timeout=10))
                warm[name].append(t)
                t, _ = timed(box.destroy)
                destroy[name].append(t)
        print("cold start = create + first exec('true'), side by side:")
        for name in names:
            print(fmt(f"{name}: cold start", cold[name]))
        print("exec('true') in a live sandbox:")
        for name in names:
            print(fmt(f"{name}: exec", warm[name]))
        print("destroy:")
        for name in names:
            print(fmt(f"{name}: destroy", destroy[name]))

        if "overlay" in subs:
            ov = subs["overlay"]
            assert isinstance(ov, OverlaySubstrate)
            in_place, recreate = [], []
            box = ov.create()
            for _ in range(args.n):
                dirty(box)
                t, _ = timed(box.reset_in_place)
                in_place.append(t)
            box.destroy()
            for _ in range(args.n):
                box = ov.create()
                dirty(box)
                t0 = time.perf_counter()
                box.destroy()
                box = ov.create()
                recreate.append(time.perf_counter() - t0)
                box.destroy()
            print("overlay reset after 200 small files written (until the sandbox is usable):")
            print(fmt("overlay: reset in place", in_place))
            print(fmt("overlay: recreate (destroy + create)", recreate))

            for big in (0, 20):
                snaps, forks, first = [], [], []
                for _ in range(max(5, args.n // 3)):
                    parent = ov.create()
                    dirty(parent, big_mb=big)
                    t, snap = timed(parent.snapshot)
                    snaps.append(t)
                    t0 = time.perf_counter()
                    child = ov.fork(snap)  # type: ignore[arg-type]
                    forks.append(time.perf_counter() - t0)
                    res = child.exec("test -f d/f200", timeout=10)
                    first.append(time.perf_counter() - t0)
                    assert res.exit_code == 0
                    child.destroy()
                    parent.destroy()
                label = f"{big} MB + 200 files" if big else "200 files"
                print(f"overlay snapshot/fork, upper layer of {label}:")
                print(fmt("overlay: snapshot()", snaps))
                print(fmt("overlay: fork()", forks))
                print(fmt("overlay: fork() + first exec", first))
    finally:
        print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for sub in subs.values():
            sub.close()
        leftovers = [x for sub in subs.values() for x in sub.leftovers()]
        if leftovers:
            print(f"LEFTOVERS: {leftovers}")
        if args.state is None:
            import shutil

            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
