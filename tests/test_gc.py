"""kill -9 of a run at concurrency 8, then `drumsbench gc`: nothing of that run remains —
no container, no mount, no process, no sandbox folder."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drumsbench.substrates import registry
from drumsbench.substrates.hostproc import pids_with_env

from conftest import require
from helpers import ROOT, cli


def _attempts(ledger: Path) -> int:
    try:
        return sqlite3.connect(ledger, timeout=5).execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _mounts_of(run_id: str) -> list[str]:
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if run_id in ln]


@pytest.mark.parametrize("substrate", ["docker", "overlay"])
def test_kill_9_at_concurrency_8_then_gc(substrate, tmp_path):
    cls = registry.get(substrate)
    require(cls.missing())
    state = tmp_path / "state"
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "run", "--substrate", substrate, "--concurrency", "8",
                             "--duration", "10m", "--policy", "explorer", "--explorer-steps", "40", "--out", str(out),
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.monotonic() + 240
    while _attempts(out / "ledger.sqlite") < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_id = sqlite3.connect(out / "ledger.sqlite").execute("SELECT run_id FROM runs").fetchone()[0]

    sub = cls(run_id, state)
    left_before = sub.leftovers()
    assert left_before, "a killed run at concurrency 8 should have left sandboxes behind"
    gc = cli("gc", env={"DRUMSBENCH_STATE": str(state)}, check=True)
    assert "1 dead run" in gc.stdout
    time.sleep(1)
    assert sub.leftovers() == [], sub.leftovers()
    assert not pids_with_env("DRUMSBENCH_RUN", run_id)
    assert not _mounts_of(run_id)
    if substrate == "docker":
        ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=drumsbench.run={run_id}"],
                            capture_output=True, text=True, check=True)
        assert ps.stdout.strip() == ""
