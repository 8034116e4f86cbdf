"""The overlay substrate's entry helper against the entry it replaced, side by side in one sandbox.

    .venv/bin/python benchmarks/overlay_entry.py [--n 300] [--state DIR]

Each round runs `true` in one live overlay sandbox through both entries, the order alternating:
``entry.argv`` (``enter.c``: setns, chroot, drop, one exec) and the old ``nsenter -r ... env --chdir
... setpriv ... true`` (three execs, the sandbox's own ``env`` and ``setpriv``). No cgroup wrapper
(both would pay it alike). Prints the medians with a 95% bootstrap interval and the median of the
per-round ratio. Needs root.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from drumsbench.substrates.bwrap import SETPRIV_CONFINE
from drumsbench.substrates.overlay import entry
from drumsbench.substrates.overlay.sandbox import OverlaySandbox, OverlaySubstrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="rounds (one exec through each entry per round)")
    ap.add_argument("--state", type=Path, default=None, help="state folder (default: a temporary one)")
    args = ap.parse_args()
    if (why := OverlaySubstrate.missing()) is not None:
        raise SystemExit(f"overlay: {why}")
    state = args.state or Path(tempfile.mkdtemp(prefix="drumsbench-entry-"))
    sub = OverlaySubstrate(f"entry-{int(time.time())}", state)
    box = sub.create()
    try:
        assert isinstance(box, OverlaySandbox)
        pid = box.holder_pid
        new = entry.argv(pid, "/sandbox/work", ["/bin/true"])
        old = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "--", "/usr/bin/env",
               "--chdir=/sandbox/work", *SETPRIV_CONFINE, "/bin/true"]
        times: dict[str, list[float]] = {"entry helper": [], "nsenter + env + setpriv": []}
        for i in range(args.n):
            pairs = [("entry helper", new), ("nsenter + env + setpriv", old)]
            for name, argv in pairs if i % 2 else pairs[::-1]:
                t0 = time.perf_counter()
                if subprocess.run(argv).returncode != 0:
                    raise SystemExit(f"{name}: `true` did not exit 0")
                times[name].append((time.perf_counter() - t0) * 1e3)
        rng = np.random.default_rng(1)
        for name, xs in times.items():
            a = np.asarray(xs)
            meds = np.median(rng.choice(a, size=(2000, a.size)), axis=1)
            print(f"{name}: exec `true` p50 {np.median(a):.2f} ms "
                  f"[{np.percentile(meds, 2.5):.2f}, {np.percentile(meds, 97.5):.2f}] (n={a.size})")
        ratio = np.asarray(times["entry helper"]) / np.asarray(times["nsenter + env + setpriv"])
        print(f"per-round ratio entry helper / old entry: median {np.median(ratio):.2f}")
    finally:
        box.destroy()
        sub.close()
        if args.state is None:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
