"""kill -9 of a run, then `drumsbench gc`: nothing of that run remains — no container, no mount,
no process, no sandbox folder, no new entry in the host's /tmp. Coding runs at concurrency 8; desktop
runs (LibreOffice under Xvfb in a container, or beside a bwrap sandbox) at concurrency 2."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_desktop import desktop_processes

from drumsbench.envs.desktop import instance
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


@pytest.mark.parametrize("substrate,tasks,concurrency", [
    ("docker", "coding", 8), ("overlay", "coding", 8), ("docker", "desktop", 2), ("bwrap", "desktop", 2),
])
def test_kill_9_then_gc(substrate, tasks, concurrency, tmp_path):
    cls = registry.get(substrate)
    require(cls.missing())
    if tasks == "desktop":
        require(instance.missing())
    state = tmp_path / "state"
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    out = tmp_path / "runs"
    policy = ["--policy", "explorer", "--explorer-steps", "40"] if tasks == "coding" else ["--policy", "oracle"]
    host_tmp = set(os.listdir("/tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "run", "--substrate", substrate, "--tasks", tasks,
                             "--concurrency", str(concurrency), "--duration", "10m", *policy, "--out", str(out),
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.monotonic() + 240
    while _attempts(out / "ledger.sqlite") < min(concurrency, 4) and time.monotonic() < deadline \
            and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_id = sqlite3.connect(out / "ledger.sqlite").execute("SELECT run_id FROM runs").fetchone()[0]

    sub = cls(run_id, state)
    left_before = sub.leftovers()
    assert left_before, f"a killed run at concurrency {concurrency} should have left sandboxes behind"
    if tasks == "desktop":
        assert desktop_processes(f"DRUMSBENCH_RUN={run_id}") or substrate == "docker", \
            "a killed desktop run should have left its instances behind"
    status = sqlite3.connect(out / "ledger.sqlite").execute("SELECT status FROM runs").fetchone()[0]
    assert status == "running"  # killed: nobody could say otherwise
    gc = cli("gc", env={"DRUMSBENCH_STATE": str(state)}, check=True)
    assert "1 dead run" in gc.stdout
    assert f"run {run_id} marked interrupted" in gc.stdout, gc.stdout
    status = sqlite3.connect(out / "ledger.sqlite").execute("SELECT status FROM runs").fetchone()[0]
    assert status == "interrupted"  # resumable (`run --resume`), never taken for a run still going
    time.sleep(1)
    assert sub.leftovers() == [], sub.leftovers()
    assert not pids_with_env("DRUMSBENCH_RUN", run_id)
    assert not desktop_processes(str(state)) and not desktop_processes(f"DRUMSBENCH_RUN={run_id}")
    assert not _mounts_of(run_id)
    assert sorted(set(os.listdir("/tmp")) - host_tmp) == []
    if substrate == "docker":
        ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=drumsbench.run={run_id}"],
                            capture_output=True, text=True, check=True)
        assert ps.stdout.strip() == ""
