"""Desktop branching with podman's own checkpoint/restore of the whole container (``podman-checkpoint``),
through the real command: continuations restored from one export of the running LibreOffice's
container are faithful on every dimension, measured beside replay in the same run; afterwards, and
after a kill -9 mid-branch followed by `drumsbench gc`, nothing of the run is left (containers,
the export, processes)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from drumsbench.core import criu_binary
from drumsbench.envs.desktop import instance
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.substrates.containers.podman import PodmanSubstrate
from drumsbench.substrates.containers.podman_cli import checkpoint_dir
from drumsbench.substrates.hostproc import pids_with_env

from conftest import require
from helpers import ROOT, cli


def _ready() -> None:
    require(instance.missing())
    require(criu_binary.missing())
    require(PodmanSubstrate.missing())


def _run_id(out: Path) -> str:
    return sqlite3.connect(out / "ledger.sqlite").execute("SELECT run_id FROM runs").fetchone()[0]


def _nothing_left(run_id: str, state: Path) -> list[str]:
    sub = PodmanSubstrate(run_id, state)
    left = sub.leftovers()  # containers of the run, exports in its checkpoint folder
    left += [f"process {pid}" for pid in pids_with_env("DRUMSBENCH_RUN", run_id)]
    left += [f"folder {checkpoint_dir(state, run_id)}"] if checkpoint_dir(state, run_id).exists() else []
    sub.close()
    return left


def test_podman_checkpoint_continuations_are_faithful_beside_replay(tmp_path):
    _ready()
    state, out = tmp_path / "state", tmp_path / "runs"
    proc = cli("branch", "--tasks", "desktop", "--substrate", "podman", "--methods", "replay,podman-checkpoint",
               "--k", "3", "--ks", "3", "--continuations", "2", "--out", str(out), "--no-progress",
               env={"DRUMSBENCH_STATE": str(state)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = _run_id(out)
    arts = artifacts.load_run(Ledger(out / "ledger.sqlite"), run_id)
    assert arts.branch_summary is not None and arts.branch_summary.prepared_unchanged
    ckpt, replay = arts.branch["podman-checkpoint"], arts.branch["replay"]
    for m in (ckpt, replay):
        assert m.errors == [], (m.method, m.errors)
        assert m.valid == 2 and m.faithful_all.faithful == m.faithful_all.total == 2, (m.method, m.faithful)
        assert all(s.faithful == s.total for s in m.faithful.values()), (m.method, m.faithful)
        assert m.creation_sequential.n == 2 and m.creation_parallel.n == 2
    # every dimension of the desktop was compared, lock files and the profile lock included
    assert {"screen", "title", "locks", "profile_lock", "document", "text", "cursor", "selection", "undo",
            "modified"} <= set(ckpt.faithful)
    assert ckpt.prepare_s > 0  # the export, timed
    print(f"creation p50: replay {replay.creation_sequential.p50.value:.2f} s, "
          f"podman-checkpoint {ckpt.creation_sequential.p50.value:.2f} s; export {ckpt.prepare_s:.2f} s")
    assert _nothing_left(run_id, state) == []


def test_kill_9_mid_branch_then_gc_leaves_nothing(tmp_path):
    _ready()
    state, out = tmp_path / "state", tmp_path / "runs"
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    argv = [sys.executable, "-m", "drumsbench", "branch", "--tasks", "desktop", "--substrate", "podman",
            "--methods", "podman-checkpoint", "--k", "2", "--ks", "2", "--continuations", "6", "--out", str(out),
            "--no-progress"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    exports = state / "podman-checkpoints"
    deadline = time.monotonic() + 300
    # the export is made and a continuation restored from it: a container of the run beside the parent's
    while time.monotonic() < deadline and proc.poll() is None:
        if any(exports.glob("*/*.tar.gz")) and len(PodmanSubstrate(_run_id(out), state).leftovers()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_id = _run_id(out)
    assert _nothing_left(run_id, state), "a killed branch should have left containers and its export behind"
    gc = cli("gc", env={"DRUMSBENCH_STATE": str(state)}, check=True)
    assert "1 dead run" in gc.stdout, gc.stdout
    time.sleep(1)
    assert _nothing_left(run_id, state) == []
