"""What the container reset's layer check costs, side by side in one run.

    .venv/bin/python benchmarks/container_reset_check.py [--engines docker,podman] [--reps 20] [--json out.json]

Per engine, one kept sandbox; interleaved ``--reps`` times: a command writes a few files into the
sandbox's folders and temp places, then either the reset's script alone (``RESET_SCRIPT``, the
reset before 2026-12-04) or the whole ``reset_in_place`` (the script, then the walk of the
container's writable layer compared with the one handed over). Printed: p50 with its 95% interval
(order statistics) per way, the ratio of the p50s (bootstrap interval), the layer walk alone, and
the load average.
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

from drumsbench.measure.stats import median_ratio, quantile
from drumsbench.substrates import registry
from drumsbench.substrates.containers import common as C

DIRTY = "echo x > /sandbox/work/w; echo t > /tmp/t; echo v > /var/tmp/v; mkdir -p /sandbox/home/.cache/d"


def _ms(t0: float) -> float:
    return 1000 * (time.monotonic() - t0)


def measure(engine: str, reps: int, state: Path) -> dict[str, Any]:
    sub = registry.get(engine)("rc-" + uuid.uuid4().hex[:6], state)
    box = sub.create()
    assert isinstance(box, C.ContainerSandbox)
    times: dict[str, list[float]] = {"script alone": [], "reset_in_place (script + layer check)": [], "layer walk": []}
    try:
        for _ in range(reps):
            for way in ("script alone", "reset_in_place (script + layer check)"):
                box.exec(["/bin/sh", "-c", DIRTY], timeout=30)
                t0 = time.monotonic()
                if way == "script alone":
                    box._run_checked(["/bin/sh", "-c", C.RESET_SCRIPT], "the reset's script")
                else:
                    box.reset_in_place()
                times[way].append(_ms(t0))
            assert box._upper is not None
            t0 = time.monotonic()
            C.layer_fingerprint(box._upper)
            times["layer walk"].append(_ms(t0))
    finally:
        box.destroy()
        sub.close()
    out: dict[str, Any] = {k: quantile(v, 0.5).model_dump() for k, v in times.items()}
    out["ratio of p50s (full / script)"] = median_ratio(times["reset_in_place (script + layer check)"],
                                                        times["script alone"]).model_dump()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="docker,podman")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, Any] = {"loadavg_before": os.getloadavg(), "reps": args.reps}
    with tempfile.TemporaryDirectory(prefix="drumsbench-rc-", dir="/var/tmp") as state:
        for engine in args.engines.split(","):
            print(f"{engine}: {args.reps} x 2 resets ...", flush=True)
            results[engine] = measure(engine, args.reps, Path(state))
            for way, est in results[engine].items():
                print(f"  {way}: {est['value']:.2f} [{est['low']:.2f}, {est['high']:.2f}]"
                      + ("" if way.startswith("ratio") else " ms"))
    results["loadavg_after"] = os.getloadavg()
    print(f"load average before / after: {results['loadavg_before'][0]:.2f} / {results['loadavg_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
