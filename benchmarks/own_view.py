"""What a process sandbox's own view (``substrates/own_view.py``) costs, side by side in one run.

    .venv/bin/python benchmarks/own_view.py [--reps 30] [--json out.json]

Two ``process`` substrates of one run folder (root: uids, cgroups): one makes each sandbox's own
network and mount namespaces, the other does not (``make_views = False``, the control of the
answer-key tests). Interleaved, ``--reps`` times each: ``create`` (the view's ``unshare`` + covers +
``ip`` for one), ``destroy``; and in one kept sandbox of each, a command started directly (no
spawner: it pays ``nsenter`` + ``env -C`` with the view) and one through the spawner (born inside:
the view costs it nothing). Printed: p50 with its 95% interval (order statistics) per case and
way, and the ratio of the p50s, with the load average.
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

from drumsbench.measure.stats import quantile
from drumsbench.substrates.base import Sandbox
from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate


class _Bare(ProcessSubstrate):
    make_views = False


def _ms(t0: float) -> float:
    return 1000 * (time.monotonic() - t0)


def measure(reps: int, state: Path) -> dict[str, Any]:
    run = "ov-" + uuid.uuid4().hex[:6]
    subs = {"view": ProcessSubstrate(run, state), "no view": _Bare(run, state)}
    samples: dict[tuple[str, str], list[float]] = {}
    kept: dict[str, Sandbox] = {}
    try:
        for way, sub in subs.items():
            kept[way] = sub.create()
        for _ in range(reps):
            for way, sub in subs.items():
                t0 = time.monotonic()
                box = sub.create()
                samples.setdefault(("create", way), []).append(_ms(t0))
                t0 = time.monotonic()
                box.destroy()
                samples.setdefault(("destroy", way), []).append(_ms(t0))
                k = kept[way]
                assert isinstance(k, ProcessSandbox)
                for case, inside in (("command, direct", False), ("command, spawner", True)):
                    k.spawns_inside = inside  # type: ignore[misc]
                    if inside:  # ready before it is timed
                        while k._live_spawner() is None or not k._live_spawner().usable():  # type: ignore[union-attr]
                            time.sleep(0.01)
                    t0 = time.monotonic()
                    res = k.exec(["true"], timeout=30)
                    samples.setdefault((case, way), []).append(_ms(t0))
                    assert res.exit_code == 0, res
    finally:
        for box in kept.values():
            box.destroy()
        for sub in subs.values():
            sub.close()
    out: dict[str, Any] = {"reps": reps, "load": os.getloadavg(), "cases": {}}
    for case in ("create", "destroy", "command, direct", "command, spawner"):
        a, b = quantile(samples[(case, "view")], 0.5), quantile(samples[(case, "no view")], 0.5)
        out["cases"][case] = {"view": a.model_dump(), "no view": b.model_dump(),
                              "ratio": (a.value or 0) / (b.value or 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.reps < 6:
        ap.error("--reps: give at least 6 (a 95% interval of the median needs them)")
    with tempfile.TemporaryDirectory(prefix="own-view-") as tmp:
        out = measure(args.reps, Path(tmp))
    print(f"p50 ms [95% interval], {args.reps} reps each, interleaved; load {out['load'][0]:.2f} on "
          f"{os.cpu_count()} cores")
    for case, c in out["cases"].items():
        v, n = c["view"], c["no view"]
        print(f"  {case:17} view {v['value']:7.2f} [{v['low']:.2f}, {v['high']:.2f}]   "
              f"no view {n['value']:7.2f} [{n['low']:.2f}, {n['high']:.2f}]   ratio {c['ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
