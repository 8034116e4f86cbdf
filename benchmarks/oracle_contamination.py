"""Oracle attempts through the real CLI: how many end invalid, and with which cause.

    .venv/bin/python benchmarks/oracle_contamination.py --substrate docker --attempts 1000 \\
        --concurrency 4 [--duration 10m] [--out runs/oracle-contamination]

The oracle policy fixes every task, so on sound infrastructure every attempt is valid-success.
Any invalid attempt is an infrastructure fault (or a gate that blames the infrastructure wrongly);
a canary found in the host's shared temp folders (``contamination``) was the case that motivated
this benchmark: runc writes each exec's argv to ``/tmp/runc-process*`` and the canary scan used to
pass its tokens as arguments. It runs ``drumsbench run --substrate S --tasks coding --policy
oracle --attempts N --duration D --concurrency C --no-progress --json ...``, stopping at whichever
comes first, then reads the run's ledger: counts per outcome, invalid per cause, and the detail of
up to ``--show`` invalid attempts per cause. Exit status 1 when any attempt was invalid.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--substrate", required=True, help="docker, podman, ... (any drumsbench substrate)")
    ap.add_argument("--attempts", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", default="10m", help="upper bound on the run's length (e.g. 10m)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "oracle-contamination")
    ap.add_argument("--cli", default=str(ROOT / ".venv" / "bin" / "drumsbench"))
    ap.add_argument("--show", type=int, default=5, help="details shown per invalid cause")
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / f"report-{args.substrate}-{int(time.time())}.json"
    cmd = [args.cli, "run", "--substrate", args.substrate, "--tasks", "coding", "--policy", "oracle",
           "--attempts", str(args.attempts), "--duration", args.duration,
           "--concurrency", str(args.concurrency), "--no-progress", "--out", str(args.out),
           "--json", str(report_path)]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    if not report_path.exists():
        print(proc.stdout[-3000:])
        print(f"drumsbench run exited {proc.returncode} without a report", file=sys.stderr)
        return 2
    report = json.loads(report_path.read_text())
    run_id = report["run_id"]

    db = sqlite3.connect(f"file:{args.out / 'ledger.sqlite'}?mode=ro", uri=True)
    rows = db.execute("SELECT outcome, cause, injected, detail FROM attempts WHERE run_id = ? ORDER BY seq",
                      (run_id,)).fetchall()
    db.close()
    by_outcome: dict[str, int] = {}
    by_cause: dict[str, list[str]] = {}
    for outcome, cause, _injected, detail in rows:
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
        if outcome == "invalid":
            by_cause.setdefault(cause or "?", []).append(detail)

    print(f"run {run_id}: substrate {args.substrate}, concurrency {args.concurrency}, "
          f"{len(rows)} attempts in {wall:.0f} s (CLI exit {proc.returncode})")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
    n_invalid = by_outcome.get("invalid", 0)
    print(f"invalid: {n_invalid} of {len(rows)}")
    for cause, details in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
        print(f"  {cause}: {len(details)}")
        for d in details[: args.show]:
            print(f"    - {d[:300]}")
    print(f"report: {report_path}; ledger: {args.out / 'ledger.sqlite'}")
    return 1 if n_invalid else 0


if __name__ == "__main__":
    sys.exit(main())
