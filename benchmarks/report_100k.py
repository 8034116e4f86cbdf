"""Time the HTML report of a 100,000-attempt ledger (target: under 10 s).

    .venv/bin/python benchmarks/report_100k.py [--attempts 100000] [--keep DIR] [--runs 1]

The ledger is synthesized through ``Ledger.record`` (drumsbench.testing.sample_ledger: a sweep over N = 1..16
and a soak on three substrates, with every artifact kind the report renders); building it takes a
while and is not timed. The timed part is what `drumsbench report RUN --html` does for the page, in a
fresh process so imports count: open the ledger, build the run report(s) from it, render and write
the HTML. It prints the time, the file size, and the time of ``summary.build`` alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMED = """
import resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from drumsbench.ledger import Ledger
from drumsbench.report.html import write_html
ledger = Ledger(Path(sys.argv[1]))
path = write_html(ledger, sys.argv[3:], Path(sys.argv[2]))
t1 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru.ru_utime + ru.ru_stime
from drumsbench.measure.summary import build
for rid in sys.argv[3:]:
    build(ledger, rid)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {cpu:.3f}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=100_000, help="attempts per run")
    ap.add_argument("--runs", type=int, default=1, help="runs side by side in one page")
    ap.add_argument("--keep", type=Path, help="keep the ledger and the page in this folder")
    ap.add_argument("--repeat", type=int, default=3, help="timed builds (the median is the figure)")
    args = ap.parse_args()

    from drumsbench.ledger import Ledger
    from drumsbench.testing.sample_ledger import synthesize

    folder = args.keep or Path(tempfile.mkdtemp(prefix="drums-report-100k-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "ledger.sqlite"
    ledger = Ledger(db)
    run_ids = [f"bench-{args.attempts}-{i}" for i in range(args.runs)]
    have = set(ledger.runs())
    t = time.perf_counter()
    for i, rid in enumerate(run_ids):
        if rid not in have:
            synthesize(ledger, rid, args.attempts, seed=i)
    ledger.close()
    print(f"ledger: {args.runs} run(s) x {args.attempts:,} attempts in {db} "
          f"(synthesized in {time.perf_counter() - t:.1f} s, not timed)")

    page = folder / "report.html"
    times, builds, cpus = [], [], []
    for _ in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", TIMED, str(db), str(page), *run_ids], capture_output=True,
                             text=True, check=True).stdout.split()
        times.append(float(out[0]))
        builds.append(float(out[1]))
        cpus.append(float(out[2]))
    times.sort()
    builds.sort()
    cpus.sort()
    median = times[len(times) // 2]
    print(f"html report of {args.runs * args.attempts:,} attempts: {median:.2f} s median of {args.repeat} "
          f"fresh processes (min {times[0]:.2f} s, max {times[-1]:.2f} s); target < 10 s: "
          f"{'met' if median < 10 else 'NOT met'}")
    print(f"  CPU time (user + sys) of the process: {cpus[len(cpus) // 2]:.2f} s median; machine load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  summary.build alone (warm, same process): {builds[len(builds) // 2]:.2f} s per page")
    if args.keep:
        print(f"  page: {page} ({page.stat().st_size / 1024:.0f} KiB)")
    else:
        print(f"  page: {page.stat().st_size / 1024:.0f} KiB (removed with its ledger; --keep FOLDER keeps them)")
        shutil.rmtree(folder, ignore_errors=True)  # nothing of the benchmark stays in /tmp
    return 0 if median < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
