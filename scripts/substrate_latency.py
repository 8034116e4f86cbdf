"""Measure a substrate's cold start, exec latency, in-place reset and file round trips.

    .venv/bin/python scripts/substrate_latency.py docker podman [--runs 15]

Cold start = ``create()`` then the first ``exec("true")`` returns (the time until a sandbox can
be used); destroy is timed separately. Exec = ``exec("true")`` into a live sandbox. Each figure is
the median of the runs with a bootstrap 95% interval, after one warm-up. Runs are sequential (one
sandbox at a time), so they show latency, not throughput.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drumsbench.substrates import registry


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def summary(ms: list[float]) -> str:
    a = np.array(ms)
    rng = np.random.default_rng(0)
    boots = np.median(rng.choice(a, size=(2000, len(a)), replace=True), axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return f"{np.median(a):7.1f} ms  [{lo:6.1f}, {hi:6.1f}]  (n={len(a)})"


def measure(name: str, runs: int) -> dict[str, list[float]]:
    cls = registry.get(name)
    missing = cls.missing()
    if missing:
        raise SystemExit(missing)
    sub = cls("lat" + uuid.uuid4().hex[:8], Path(tempfile.mkdtemp(prefix="drumsbench-lat-")))
    out: dict[str, list[float]] = {"cold start (create + first exec)": [], "destroy": []}
    try:
        sub.create().destroy()  # warm-up (and builds the image if absent)
        for _ in range(runs):
            box = None

            def cold() -> None:
                nonlocal box
                box = sub.create()
                box.exec("true", timeout=30)

            out["cold start (create + first exec)"].append(timed(cold))
            assert box is not None
            out["destroy"].append(timed(box.destroy))
        box = sub.create()
        try:
            box.exec("true", timeout=30)
            out["exec true"] = [
                timed(lambda: box.exec("true", timeout=30)) for _ in range(runs * 2)
            ]
            path = f"{box.paths.work}/f.txt"
            out["write_file 1 KiB"] = [
                timed(lambda: box.write_file(path, b"x" * 1024)) for _ in range(runs)
            ]
            out["read_file 1 KiB"] = [timed(lambda: box.read_file(path)) for _ in range(runs)]
            out["reset_in_place"] = [timed(box.reset_in_place) for _ in range(runs)]
        finally:
            box.destroy()
    finally:
        sub.close()
    return out


def version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("substrates", nargs="+")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    commit = version(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"])
    print(
        f"machine: {platform.node()}, kernel {platform.release()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores; commit {commit}"
    )
    for name in args.substrates:
        if name == "docker":
            print("docker:", version(["/usr/bin/docker", "version", "-f", "{{.Server.Version}}"]))
        if name == "podman":
            print("podman:", version(["podman", "--version"]))
        for what, ms in measure(name, args.runs).items():
            print(f"  {name:8s} {what:34s} {summary(ms)}")


if __name__ == "__main__":
    main()
