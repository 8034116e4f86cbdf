"""The Ray executor on a real Ray cluster of two nodes on loopback (``ray.cluster_utils.Cluster``).

Every process here that starts or joins Ray carries the loopback settings of
``drumsbench.executors.ray_env`` (set by the fixture, inherited by the nodes and by the CLI
subprocesses): on these machines Ray's defaults send traffic off the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from drumsbench.core import criu
from drumsbench.core.machine import commit, machine_info
from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.executors import ray_env
from drumsbench.executors.ray import missing as ray_missing
from drumsbench.executors.ray_env import processes_with_tmpdir
from drumsbench.experiments.run import RunConfig, execute, new_run_id, open_ledger
from drumsbench.ledger import Ledger
from drumsbench.measure.summary import build
from drumsbench.rollout.attempt import RolloutConfig

from conftest import require
from helpers import MINI, ROOT, cli

MiB = 1024 * 1024
FAST_HEALTH = ray_env.health_check_config(fast=True)


# -- the cluster ---------------------------------------------------------------------------------
@contextlib.contextmanager
def loopback_cluster(extra_nodes: int = 1, health: dict[str, int] | None = None, store_mib: int = 80):
    """A real ``cluster_utils.Cluster`` on 127.0.0.1: head (1 CPU) + ``extra_nodes`` nodes ``node_2``...
    (1 CPU each), object stores of ``store_mib``, lost nodes marked dead in about a second (or by ``health``,
    Ray's health-check settings); this process connected as the driver. Yields (cluster, env, the
    extra nodes); nothing of it is left after, even when the head does not start."""
    require(ray_missing())
    imported = "ray" in sys.modules
    env = ray_env.apply()
    import ray
    from ray.cluster_utils import Cluster

    if imported:
        ray_env.reload_auth()
    try:
        c = Cluster(initialize_head=True, head_node_args={
            "node_ip_address": ray_env.LOOPBACK, "num_cpus": 1, "object_store_memory": store_mib * MiB,
            "include_dashboard": False, "_system_config": FAST_HEALTH if health is None else health})
    except BaseException:
        env.restore()  # stops what the head started and removes its folder
        raise
    try:
        nodes = [c.add_node(node_ip_address=ray_env.LOOPBACK, num_cpus=1, resources={f"node_{i}": 1},
                            object_store_memory=store_mib * MiB) for i in range(2, 2 + extra_nodes)]
        ray.init(address=c.address, _node_ip_address=ray_env.LOOPBACK, logging_level="WARNING")
        c.wait_for_nodes(timeout=120)  # a loaded machine registers nodes slowly
        yield c, env, nodes
    finally:
        ray.shutdown()
        c.shutdown()
        env.restore(remove_folder=False)
        left = processes_with_tmpdir(env.tmpdir)
        env.restore()
        assert not left, f"Ray processes left behind: {left}"


@pytest.fixture(scope="module")
def cluster():
    """Head (1 CPU) + ``node_2`` (1 CPU) on 127.0.0.1, lost nodes marked dead in about a second."""
    with loopback_cluster(1) as (c, env, _):
        yield c, env


def _descendants(root: int) -> set[int]:
    """``root`` and all its descendants."""
    return set(criu.tree_pids(root))


def lose_node(c, node, everything: bool = False) -> None:
    """Lose ``node`` as when its machine dies: SIGKILL its Ray workers and agents (the raylet's own
    children) first, then the raylet and the rest of Ray's processes of the node; with
    ``everything``, the workers' descendants too (otherwise what a worker started, e.g. a sandbox,
    outlives it, for the driver's clean-up to find). Killing only the raylet is not enough: a worker
    notices its raylet gone only later, and may hand in a result, or start new work, before it does."""
    raylet = node.all_processes["raylet"][0].process.pid
    workers = set(criu.all_children(raylet))  # the kernel's list: no scan of /proc before the kill
    for victim in workers:
        with contextlib.suppress(OSError):
            os.kill(victim, signal.SIGKILL)
    if everything:
        for victim in _descendants(raylet) - {raylet} - workers:
            with contextlib.suppress(OSError):
                os.kill(victim, signal.SIGKILL)
    c.remove_node(node, allow_graceful=False)


def _is_loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
    return host.startswith("127.") or host == "::1"


def ray_sockets_off_loopback() -> tuple[int, list[str]]:
    """(number of inet sockets of this process and its descendants, those not on loopback), by ``ss``."""
    pids = _descendants(os.getpid())
    out = subprocess.run(["ss", "-tunapH"], capture_output=True, text=True, check=True).stdout
    mine, bad = 0, []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        mine += 1
        cols = line.split()
        local, peer = cols[4], cols[5]
        if not _is_loopback(local) or not (peer.endswith(":*") or _is_loopback(peer)):
            bad.append(line)
    return mine, bad


# -- running through the engine ------------------------------------------------------------------
def _run(out: Path, cfg: RunConfig, on_progress=None) -> tuple[Ledger, str, str]:
    ledger = open_ledger(out)
    run_id = new_run_id()
    ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
    status, _ = execute(ledger, run_id, cfg, resume=False, on_progress=on_progress)
    return ledger, run_id, status


def _run_losing_node(c, node, out: Path, cfg: RunConfig, due: Callable[[Ledger], bool]) -> tuple[Ledger, str, float]:
    """Run ``cfg`` on the cluster ``c`` and lose ``node`` (``lose_node``: as when its machine dies) at the first
    progress tick where ``due(ledger)`` holds; the run must complete. Returns (ledger, run id, when
    the node was removed)."""
    ledger = open_ledger(out)
    run_id = new_run_id()
    removed: list[float] = []

    def kill_when_due(_progress) -> None:
        if not removed and due(ledger):
            lose_node(c, node)
            removed.append(time.time())

    ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
    try:
        status, _ = execute(ledger, run_id, cfg, resume=False, on_progress=kill_when_due)
    finally:
        if not removed:
            c.remove_node(node)
    assert removed, "the node was never removed"
    assert status == "complete"
    return ledger, run_id, removed[0]


def _records(ledger: Ledger, run_id: str) -> list[AttemptRecord]:
    cols = ("seq", "task", "outcome", "cause", "reward", "host", "executor", "worker", "extra", "detail",
            "t_start", "t_end")
    recs = []
    for row in ledger.attempts(run_id, cols):
        d = dict(zip(cols, row, strict=True))
        d["extra"] = json.loads(d["extra"])
        recs.append(AttemptRecord(run_id=run_id, substrate="process", env="coding", policy="?", **d))
    return recs


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def test_same_controls_on_ray_as_in_process(cluster, tmp_path, state):
    """Oracle 100 %, null 0 % on the built-in suite, task by task the same on Ray and in process;
    attempts spread over both nodes; every Ray socket on loopback while attempts run."""
    sockets: list[tuple[int, list[str]]] = []

    def check_sockets(_progress) -> None:
        if not sockets:
            sockets.append(ray_sockets_off_loopback())

    outcomes: dict[tuple[str, str], dict[str, Outcome]] = {}
    for executor in ("ray", "local"):
        for policy in ("oracle", "null"):
            cfg = RunConfig(tasks="coding", policy=policy, executor=executor, concurrency=1 if executor == "ray" else 2,
                            max_attempts=15, duration_s=600)
            ledger, run_id, status = _run(tmp_path / "runs", cfg, check_sockets if executor == "ray" else None)
            assert status == "complete"
            recs = _records(ledger, run_id)
            assert sorted(r.seq for r in recs) == list(range(15))
            outcomes[executor, policy] = {r.task: r.outcome for r in recs}
            report = build(ledger, run_id)
            assert report.isolation_confirmed
            if executor == "ray":
                assert {r.executor for r in recs} == {"ray"}
                assert {r.host for r in recs} == {socket.gethostname()}
                assert len({r.extra["node"] for r in recs}) == 2, "attempts ran on one node only"
                assert len({r.worker for r in recs}) == 2
                # a control on the driver's host, one per node and the cross-node one, all fired
                assert len(report.controls) == 4 and all(c.fired for c in report.controls)
                assert sum("cross-node" in c.detail for c in report.controls) == 1
                # per-node lines: both nodes ran attempts, and they add up to the run
                assert len(report.nodes) == 2 and sum(n.attempts for n in report.nodes.values()) == 15
                # two Ray nodes on one machine are one host: host-hours are not doubled
                assert report.host_count == 1 and report.hosts[socket.gethostname()].nodes == 2
                assert report.host_seconds == pytest.approx(report.wall_seconds)
    for executor in ("ray", "local"):
        assert set(outcomes[executor, "oracle"].values()) == {Outcome.SUCCESS}, outcomes[executor, "oracle"]
        assert set(outcomes[executor, "null"].values()) == {Outcome.FAILED}, outcomes[executor, "null"]
    assert outcomes["ray", "oracle"].keys() == outcomes["local", "oracle"].keys()

    assert sockets, "the socket check did not run"
    mine, bad = sockets[0]
    assert mine > 10, f"only {mine} inet sockets seen: is ss showing the Ray processes?"
    assert not bad, "Ray sockets off loopback:\n" + "\n".join(bad)


def test_lost_node_turns_its_in_flight_attempts_invalid(cluster, tmp_path, state):
    """A third node is killed mid-run: exactly its in-flight attempts are invalid/substrate_failure,
    every sequence number is recorded once, and the other nodes finish the run."""
    c, _ = cluster
    node3 = c.add_node(node_ip_address=ray_env.LOOPBACK, num_cpus=1, resources={"node_3": 1},
                       object_store_memory=80 * MiB)
    node3_id = node3.node_id

    def busy(ledger: Ledger) -> bool:
        return ledger.db.execute("SELECT COUNT(*) FROM attempts WHERE extra LIKE ?",
                                 (f"%{node3_id}%",)).fetchone()[0] >= 2

    cfg = RunConfig(tasks=MINI, policy="oracle", executor="ray", concurrency=2, max_attempts=36, duration_s=600,
                    rollout=RolloutConfig(think_time_s=0.1))
    ledger, run_id, removed = _run_losing_node(c, node3, tmp_path / "runs", cfg, busy)

    recs = _records(ledger, run_id)
    assert sorted(r.seq for r in recs) == list(range(36)), "an attempt is missing or recorded twice"
    lost = [r for r in recs if r.extra.get("lost_node")]
    on3 = [r for r in recs if r.extra["node"] == node3_id]
    assert len(lost) == cfg.concurrency, [(r.seq, r.detail) for r in lost]
    for r in lost:
        assert r.extra["node"] == node3_id
        assert (r.outcome, r.cause, r.reward) == (Outcome.INVALID, "substrate_failure", None)
        assert "lost mid-attempt" in r.detail
    assert all(r.outcome is Outcome.SUCCESS for r in recs if not r.extra.get("lost_node")), \
        [(r.seq, r.detail) for r in recs if r.outcome is not Outcome.SUCCESS]
    assert len(on3) - len(lost) >= 2 and all(r.t_end <= removed + 1 for r in on3 if r not in lost)
    # work handed to node 3 as it died is among `lost`; everything completed after must be elsewhere
    after = [r for r in recs if r.t_start > removed and not r.extra.get("lost_node")]
    # the run goes on without the lost node (which of the others took the remaining work is timing)
    assert after and node3_id not in {r.extra["node"] for r in after}
    report = build(ledger, run_id)
    assert report.invalid["substrate_failure"] == report.invalid_not_injected == len(lost)
    # what the lost node left on this host was removed at the end of the run
    assert not (state / "sandboxes" / run_id).exists() or not any((state / "sandboxes" / run_id).iterdir())


def test_cli_joins_a_cluster_by_address(cluster, tmp_path, state):
    c, _ = cluster
    out = tmp_path / "runs"
    proc = cli("run", "--executor", "ray", "--ray-address", c.address, "--tasks", MINI, "--attempts", "6",
               "--concurrency", "1", "--out", str(out), "--json", str(tmp_path / "r.json"), "--no-progress",
               env={"DRUMSBENCH_STATE": str(state)}, check=True)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["attempts"] == report["success"] == 6, proc.stdout
    assert report["config"]["executor"] == "ray" and report["config"]["ray_address"] == c.address
    assert "executor ray" in report["conditions"]
    nodes = {json.loads(e)["node"] for (e,) in sqlite3.connect(out / "ledger.sqlite").execute(
        "SELECT extra FROM attempts")}
    assert len(nodes) == 2


@pytest.mark.parametrize("args,needle", [
    (["--executor", "spark"], "--executor"),
    (["--executor", "ray", "--ray-address", "192.0.2.7:6379"], "not a loopback address"),
    (["--ray-address", "127.0.0.1:6379"], "only with --executor ray"),
])
def test_bad_ray_input_one_line_exit_2(args, needle, tmp_path):
    proc = cli("run", "--tasks", MINI, "--out", str(tmp_path / "runs"), "--duration", "2s", *args,
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert sqlite3.connect(tmp_path / "runs" / "ledger.sqlite").execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_cli_starts_its_own_loopback_ray_and_stops_it_on_ctrl_c(tmp_path):
    """No address: the run starts a single-node Ray of its own on loopback; Ctrl-C stops the run
    (in-flight attempts dropped, status interrupted) and leaves no Ray process behind."""
    require(ray_missing())
    tmpdir = tempfile.mkdtemp(prefix="dray-cli-", dir=ray_env.short_tmp())
    out = tmp_path / "runs"
    env = {**os.environ, "DRUMSBENCH_STATE": str(tmp_path / "state"), "RAY_TMPDIR": tmpdir}
    for key in ("RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(key, None)
    try:
        _ctrl_c_own_ray(tmp_path, out, env, tmpdir)
    finally:
        subprocess.run(["rm", "-rf", tmpdir], check=False)


def _ctrl_c_own_ray(tmp_path: Path, out: Path, env: dict[str, str], tmpdir: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "run", "--executor", "ray", "--tasks", MINI,
                             "--concurrency", "2", "--duration", "10m", "--out", str(out), "--no-progress"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                db = sqlite3.connect(out / "ledger.sqlite", timeout=5)
                n = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
            except sqlite3.OperationalError:
                n = 0
            if n >= 4:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    db = sqlite3.connect(out / "ledger.sqlite")
    assert db.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    rows = db.execute("SELECT outcome, executor, host FROM attempts").fetchall()
    assert len(rows) >= 4 and {r[:2] for r in rows} == {("success", "ray")}
    time.sleep(0.5)
    assert not processes_with_tmpdir(tmpdir), "Ray processes left behind"
    assert not any((tmp_path / "state" / "sandboxes").glob("*/*")), "sandboxes left behind"


def test_host_hours_are_hosts_times_hours(tmp_path):
    """Two hosts for one hour are two host-hours: throughput and cost are per host, summed right."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run("r", "run", {"executor": "ray", "concurrency": 1}, {}, "c")
    ledger.start_segment("r", 1)
    t0 = time.time()
    ledger.db.execute("UPDATE segments SET started = ?, ended = ? WHERE run_id = 'r'", (t0, t0 + 3600))
    for seq in range(30):
        host = "a" if seq % 3 else "b"
        ledger.record(AttemptRecord(run_id="r", seq=seq, task="t", substrate="process", env="coding", policy="p",
                                    executor="ray", host=host, outcome=Outcome.SUCCESS, reward=1.0,
                                    t_start=t0 + seq * 100, t_end=t0 + seq * 100 + 1, extra={"node": host}))
    ledger.db.execute("UPDATE segments SET ended = ? WHERE run_id = 'r'", (t0 + 3600,))
    r = build(ledger, "r")
    assert r.wall_seconds == pytest.approx(3600)
    assert r.host_count == 2 and r.host_seconds == pytest.approx(7200)
    assert r.valid_per_host_hour.value == pytest.approx(15)
    assert (r.hosts["a"].attempts, r.hosts["b"].attempts) == (20, 10)
    assert r.hosts["a"].valid_per_host_hour.value == pytest.approx(20)
    assert "2 host(s)" in r.conditions


def test_ray_window_counts_live_sandboxes_and_setup_is_not_work(cluster, tmp_path, state):
    """A window on Ray: the executor's ``on_ready`` starts the work after the nodes' set-up (the
    window still has its full length of work), and the live-sandbox count comes from the nodes."""
    from drumsbench.measure import artifacts
    from drumsbench.measure.artifacts import SegmentArtifact

    ledger = open_ledger(tmp_path / "runs")
    run_id = new_run_id()
    cfg = RunConfig(tasks=MINI, policy="oracle", executor="ray", concurrency=1, duration_s=4.0, window="w1",
                    rollout=RolloutConfig(think_time_s=0.05))
    ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
    execute(ledger, run_id, cfg, resume=False)
    seg = artifacts.load(ledger, run_id, SegmentArtifact)["w1"]
    live = seg.resources["live_sandboxes"]
    assert live["max"] is not None and live["max"] >= 1, live  # it read 0 before: the job's own count
    # the nodes' controls (and the cross-node one) ran during set-up, before the work started
    (last_control,) = ledger.db.execute("SELECT MAX(t) FROM controls WHERE run_id = ? AND detail LIKE ?",
                                         (run_id, "%cross-node%")).fetchone()
    assert last_control is not None and seg.work_started >= last_control
    assert seg.ended - seg.work_started >= cfg.duration_s - 0.5, "the set-up ate into the window's work"
    starts = [r.t_start for r in _records(ledger, run_id)]
    assert starts and min(starts) >= seg.work_started - 0.5, "an attempt started before the nodes were ready"
