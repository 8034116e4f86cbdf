"""``drumsbench cluster up/down``: a real multi-node loopback Ray cluster on this machine, joined by
a run through the printed address and token file, and nothing left running or on disk after down."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from drumsbench.core.host_state import alive
from drumsbench.executors.ray import missing as ray_missing
from drumsbench.executors.ray_env import processes_with_tmpdir

from conftest import require
from helpers import MINI, ROOT, cli


def _env(state: Path) -> dict[str, str]:
    env = {"DRUMSBENCH_STATE": str(state)}
    return env


def _clean_env(state: Path) -> dict[str, str]:
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    for key in ("RAY_AUTH_TOKEN_PATH", "RAY_TMPDIR", "RAY_ADDRESS"):
        env.pop(key, None)
    return env


def _field(out: str, name: str) -> str:
    m = re.search(rf"^{name}\s+(\S+)$", out, re.M)
    assert m, out
    return m.group(1)


def test_cluster_up_detached_is_joined_by_a_run_and_down_leaves_nothing(tmp_path):
    require(ray_missing())
    state = tmp_path / "state"
    env = _clean_env(state)
    up = subprocess.run([sys.executable, "-m", "drumsbench", "cluster", "up", "--nodes", "2", "--detach"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=400)
    info_file = state / "ray-cluster" / "cluster.json"
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        address, token, tmpdir = _field(up.stdout, "address"), _field(up.stdout, "token file"), \
            _field(up.stdout, "RAY_TMPDIR")
        assert address.startswith("127.0.0.1:") and Path(token).is_file()
        assert oct(Path(token).stat().st_mode & 0o777) == "0o600"
        info = json.loads(info_file.read_text())
        pid = info["pid"]
        assert (state / "ray-cluster" / "cluster.pid").read_text().strip() == str(pid)
        assert processes_with_tmpdir(tmpdir), "no Ray process carries the cluster's RAY_TMPDIR"
        # a second `up` refuses while this one runs
        again = cli("cluster", "up", "--nodes", "1", env=_env(state))
        assert again.returncode == 2 and "already running" in again.stderr.strip().splitlines()[-1]
        # a run joins it by the printed address and token file and uses both nodes
        out = tmp_path / "runs"
        run = cli("run", "--executor", "ray", "--ray-address", address, "--tasks", MINI, "--attempts", "4",
                  "--concurrency", "1", "--out", str(out), "--no-progress",
                  env={**_env(state), "RAY_AUTH_TOKEN_PATH": token}, timeout=400)
        assert run.returncode == 0, run.stdout + run.stderr
        nodes = {json.loads(e)["node"] for (e,) in sqlite3.connect(out / "ledger.sqlite").execute(
            "SELECT extra FROM attempts")}
        assert len(nodes) == 2
    finally:
        down = cli("cluster", "down", env=_env(state), timeout=200)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    time.sleep(0.5)
    assert not processes_with_tmpdir(tmpdir), "Ray processes left after down"
    assert not Path(info["folder"]).exists() and not Path(token).exists(), "the cluster's temp folder is left"
    assert not (state / "ray-cluster").exists()
    assert not alive(pid), f"the cluster's owner {pid} still runs"  # a zombie (no reaper here) is not running
    # down again: nothing to do, one line
    assert "no cluster" in cli("cluster", "down", env=_env(state)).stdout


def test_cluster_up_in_the_foreground_stops_on_ctrl_c(tmp_path):
    require(ray_missing())
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "cluster", "up", "--nodes", "2"],
                            env=_clean_env(state), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info_file = state / "ray-cluster" / "cluster.json"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not info_file.exists():
            time.sleep(0.3)
        assert proc.poll() is None and info_file.exists(), proc.communicate()
        info = json.loads(info_file.read_text())
        assert processes_with_tmpdir(info["tmpdir"])
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    assert "address" in stdout and "cluster stopped" in stderr
    time.sleep(0.5)
    assert not processes_with_tmpdir(info["tmpdir"]) and not Path(info["folder"]).exists()
    assert not info_file.exists()
