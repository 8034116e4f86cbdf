"""``drumsbench serve``'s /health while hostile clients run, against the same server quiet, in one run.

    .venv/bin/python benchmarks/serve_hostile.py [--rounds 5] [--quiet-s 10] [--json out.json]

One real server (``drumsbench serve --port 0``, process substrate, 8 sessions, idle limit 20 s) in a
temporary state and out folder. Phase ``quiet``: /health asked every 20 ms for ``--quiet-s``
seconds with no client. Phase ``hostile``: ``--rounds`` rounds of ``testing.hostile_clients``'s mix
(3 bad HTTP resets, 3 WebSocket clients that send bad messages and drop mid-step, 2 FIFO planters,
2 foreign-origin handshakes; 6 at a time), /health asked every 20 ms throughout, each round until
the server has no session. Printed per phase: p50 and p99 with their 95% intervals (order
statistics), the maximum, the share over the 100 ms target; and the server's open descriptors
before and after (they must be back). The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from drumsbench.measure.stats import quantile
from drumsbench.testing.hostile_clients import CLIENTS, HealthPoller, open_fds

MIX = ["bad_http"] * 3 + ["bad_ws_then_drop"] * 3 + ["fifo"] * 2 + ["web_page"] * 2
TARGET_MS = 100.0


def _settle(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/drumsbench/status", timeout=10).json()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.1)


def _summary(lat: list[float]) -> dict[str, Any]:
    return {"n": len(lat), "p50": quantile(lat, 0.5).model_dump(), "p99": quantile(lat, 0.99).model_dump(),
            "max": max(lat), "over_target": sum(x > TARGET_MS for x in lat) / len(lat)}


def measure(rounds: int, quiet_s: float, folder: Path) -> dict[str, Any]:
    env = {**os.environ, "DRUMSBENCH_STATE": str(folder / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "serve", "--port", "0", "--out", str(folder / "out"),
                             "--max-sessions", "8", "--idle", "20s"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("drumsbench serve: "):
            raise SystemExit(f"serve_hostile: the server did not start: {line.strip()}")
        url = line.split()[2].replace("/t/<token>", "")
        with HealthPoller(url) as quiet:
            time.sleep(quiet_s)
        fds_before = open_fds(proc.pid)
        with HealthPoller(url) as hostile, ThreadPoolExecutor(6) as pool:
            for r in range(rounds):
                list(pool.map(lambda job: CLIENTS[job[2]](url, job[0] + job[1]), [(100 * r, i, name) for i, name
                                                                                  in enumerate(MIX)]))
                _settle(url)
                print(f"  round {r + 1}/{rounds} done", file=sys.stderr)
        deadline = time.monotonic() + 30
        while open_fds(proc.pid) > fds_before and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"quiet": _summary(quiet.latencies_ms), "hostile": _summary(hostile.latencies_ms),
                "errors": quiet.errors + hostile.errors, "fds_before": fds_before, "fds_after": open_fds(proc.pid),
                "rounds": rounds, "load": os.getloadavg()}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quiet-s", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.rounds < 1 or args.quiet_s <= 0:
        ap.error("--rounds: at least 1; --quiet-s: above 0")
    with tempfile.TemporaryDirectory(prefix="serve-hostile-") as tmp:
        out = measure(args.rounds, args.quiet_s, Path(tmp))
    print(f"/health every 20 ms, target {TARGET_MS:g} ms; load {out['load'][0]:.2f} on {os.cpu_count()} cores")
    for phase in ("quiet", "hostile"):
        s = out[phase]
        p50, p99 = (f"{s[q]['value']:.1f} [{s[q]['low']:.1f}, {s[q]['high']:.1f}]" for q in ("p50", "p99"))
        print(f"  {phase:8} n {s['n']:5}  p50 {p50} ms  p99 {p99} ms  max {s['max']:.1f} ms  "
              f"over target {100 * s['over_target']:.2f}%")
    print(f"  server descriptors: {out['fds_before']} before the hostile clients, {out['fds_after']} after; "
          f"errors: {len(out['errors'])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
