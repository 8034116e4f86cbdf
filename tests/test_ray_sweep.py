"""``sweep --executor ray`` and the cluster-wide canary registry on a real 3-node Ray cluster on
loopback (``ray.cluster_utils.Cluster``; every process carries ``ray_env``'s loopback settings).

Windows are seconds long (CI's budget); the stability tolerance is 1.0 (a half with no valid
rollout still fails) because a few seconds on a loaded 2-core machine give halves of a handful of
rollouts. The confirmation rules themselves are the sweep's own.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from test_ray import loopback_cluster, lose_node, ray_sockets_off_loopback

from drumsbench.core.machine import commit, machine_info
from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.experiments.run import RunConfig, execute, new_run_id, open_ledger
from drumsbench.experiments.sweep import SweepConfig, build, publish, run_sweep
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import SegmentArtifact
from drumsbench.measure.cluster import ClusterSweepReport
from drumsbench.measure.summary import build as build_run
from drumsbench.measure.windows import ClusterArtifact, ClusterNode, Criteria, judge, usage
from drumsbench.report.html.page import write_html
from drumsbench.report.sweep import print_sweep
from drumsbench.rollout.attempt import RolloutConfig

from helpers import MINI, cli


@pytest.fixture(scope="module")
def cluster3():
    """Head + ``node_2`` + ``node_3``, 1 CPU each, small object stores, lost nodes dead in ~1 s."""
    with loopback_cluster(2) as (c, _, nodes):
        yield c, nodes


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def _sweep(out: Path, levels: list[int], window_s: float, on_start=None, on_window=None) -> tuple[Ledger, str, str]:
    base = RunConfig(tasks=MINI, policy="oracle", executor="ray", concurrency=1, duration_s=window_s,
                     rollout=RolloutConfig(think_time_s=0.05))
    cfg = SweepConfig(base=base, concurrency=levels, window_s=window_s, soak_s=None, stability=1.0, min_gain=0.0)
    ledger = open_ledger(out)
    run_id = new_run_id()
    ledger.create_run(run_id, "sweep", cfg.model_dump(mode="json"), machine_info(), commit())
    status = run_sweep(ledger, run_id, cfg, on_start=on_start, on_window=on_window)
    return ledger, run_id, status


def _seqs(ledger: Ledger, run_id: str) -> list[int]:
    return [s for (s,) in ledger.db.execute("SELECT seq FROM attempts WHERE run_id = ? ORDER BY seq", (run_id,))]


def test_sweep_on_ray_confirms_windows_and_reports_n_max_per_node_and_cluster(cluster3, tmp_path, state):
    sockets: list[tuple[int, list[str]]] = []

    def check_sockets(label: str, n: int, s: float) -> None:
        if label == "N2":  # while the first windows' actors are gone and N2's are coming up: Ray itself
            sockets.append(ray_sockets_off_loopback())

    ledger, run_id, status = _sweep(tmp_path / "runs", [1, 2], 5.0, on_start=check_sockets)
    assert status == "complete"
    r = build(ledger, run_id)
    assert isinstance(r, ClusterSweepReport)
    labels = [v.label for v in r.windows]
    assert labels[:2] == ["N1", "node-N1"], labels
    by = {v.label: v for v in r.windows}
    n1, alone1 = by["N1"], by["node-N1"]
    # the cluster window ran on all three nodes, the node-alone window on one; both on one host
    assert sum(1 for ln in n1.nodes if ln.attempts) == 3, [ln.model_dump() for ln in n1.nodes]
    assert sum(1 for ln in alone1.nodes if ln.attempts) == 1 and len(alone1.nodes) == 3  # idle nodes listed
    assert n1.host_count == alone1.host_count == 1
    for v in (n1, alone1):
        assert {c.name for c in v.checks} >= {"full_length", "invalid_rate", "isolation_control", "stable", "nodes"}
        assert next(c for c in v.checks if c.name == "nodes").passed
    # per-node lines add up to the window; each node's rate is its own
    assert sum(ln.attempts for ln in n1.nodes) == n1.attempts
    assert sum(ln.valid for ln in n1.nodes) == n1.valid
    # the controls of the cluster window: the driver's, one per node and the cross-node one, all fired
    controls = [c for c in ledger.controls(run_id) if c["window"] == "N1"]
    assert len(controls) == 5 and all(c["fired"] for c in controls), controls
    confirmed = [v for v in r.windows if v.confirmed]
    assert confirmed, "\n".join(f"{v.label}: {v.verdict_line()}" for v in r.windows)
    cl = r.cluster
    assert cl.nodes == 3 and cl.hosts == 1
    assert r.n_max == cl.n_max_cluster and r.n_max is not None, r.n_max_reason
    assert cl.n_max_per_node is not None, [lv.model_dump() for lv in cl.levels]
    lv1 = cl.levels[0]
    assert lv1.ideal_per_hour == pytest.approx(3 * lv1.alone_per_hour.value)
    assert lv1.tax is not None and lv1.tax.value == pytest.approx(1 - lv1.cluster_per_hour.value / lv1.ideal_per_hour)
    assert "Ray, 3 node(s)" in r.conditions
    assert r.dump()["cluster"]["n_max_per_node"] == cl.n_max_per_node
    # host-hours: one host for the whole sweep (three nodes on one machine are one host)
    assert r.host_seconds == pytest.approx(sum(e - s for s, e, _ in ledger.segments(run_id)))
    assert sockets and sockets[0][0] > 10 and not sockets[0][1], sockets
    # the report shows per-node throughput, the cluster's and the tax: terminal and HTML
    console = Console(record=True, width=240)
    print_sweep(r, console)
    text = console.export_text()
    assert "N_max per node" in text and "N_max for the cluster" in text and "coordination" in text
    assert all(ln.node_id[:8] in text for ln in n1.nodes)
    publish(ledger, run_id, r)
    write_html(ledger, [run_id], tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "valid per node-hour" in page and "Coordination tax" in page and f"{run_id}/tax/N1" in page


def test_cross_node_canary_control_fires_and_a_per_node_registry_would_miss_it(cluster3, tmp_path, state):
    """A canary of a sandbox on node A planted in a sandbox on node B is caught on B (positive control)."""
    out = tmp_path / "runs"
    ledger = open_ledger(out)
    run_id = new_run_id()
    cfg = RunConfig(tasks=MINI, policy="oracle", executor="ray", concurrency=1, max_attempts=6, duration_s=600)
    ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
    status, _ = execute(ledger, run_id, cfg, resume=False)
    assert status == "complete"
    cross = [c for c in ledger.controls(run_id) if "cross-node" in c["detail"]]
    assert len(cross) == 1, ledger.controls(run_id)
    assert cross[0]["fired"], cross[0]
    assert "detected: True" in cross[0]["detail"] and "clean A reported clean: True" in cross[0]["detail"]
    # without the cluster's registry the leak would have gone unseen: the control is not vacuous
    assert "a per-node registry would have caught it: False" in cross[0]["detail"]
    report = build_run(ledger, run_id)
    assert report.isolation_confirmed and report.success == 6


def test_node_killed_mid_window_unconfirms_it_and_loses_no_attempt(cluster3, tmp_path, state):
    """Runs last in this module: it kills node 3."""
    c, nodes = cluster3
    victim = nodes[-1]
    killed: list[float] = []
    out = tmp_path / "runs"

    def killer() -> None:
        db = Ledger(out / "ledger.sqlite")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            n = db.db.execute("SELECT COUNT(*) FROM attempts WHERE window = 'N1' AND extra LIKE ?",
                              (f"%{victim.node_id}%",)).fetchone()[0]
            if n >= 2:
                lose_node(c, victim)  # as when a machine dies
                killed.append(time.time())
                return
            time.sleep(0.1)

    def on_start(label: str, n: int, s: float) -> None:
        if label == "N1":
            threading.Thread(target=killer, daemon=True).start()

    ledger, run_id, status = _sweep(out, [1, 2], 8.0, on_start=on_start)
    assert killed, "node 3 was never killed"
    assert status == "complete"
    r = build(ledger, run_id)
    n1 = next(v for v in r.windows if v.label == "N1")
    assert not n1.confirmed
    nodes_check = next(ch for ch in n1.checks if ch.name == "nodes")
    assert not nodes_check.passed and victim.node_id[:8] in nodes_check.detail and "lost mid-window" in \
        nodes_check.detail, nodes_check
    assert any("lost mid-window" in reason for reason in n1.reasons)
    lost = next(ln for ln in n1.nodes if ln.node_id == victim.node_id)
    assert not lost.finished and lost.lost_attempts == 1  # N=1: its one in-flight attempt
    # no recorded attempt lost: every sequence number once, the lost one recorded invalid
    seqs = _seqs(ledger, run_id)
    assert seqs == list(range(len(seqs)))
    assert n1.invalid_by_cause["substrate_failure"] == 1
    # the climb stops at the unconfirmed window; the node-alone baseline still ran on a live node
    assert r.climb_stopped and "N=1 not confirmed" in r.climb_stopped and r.n_max is None
    alone = next(v for v in r.windows if v.label == "node-N1")
    assert victim.node_id not in {ln.node_id for ln in alone.nodes if ln.attempts}


@pytest.mark.parametrize("args,needle", [
    (["--executor", "spark"], "--executor"),
    (["--executor", "ray", "--ray-address", "192.0.2.7:6379"], "not a loopback address"),
    (["--ray-address", "127.0.0.1:6379"], "only with --executor ray"),
])
def test_sweep_bad_ray_input_one_line_exit_2(args, needle, tmp_path):
    proc = cli("sweep", "--tasks", MINI, "--out", str(tmp_path / "runs"), "--concurrency", "1", "--window", "2s",
               "--soak", "none", *args, env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_an_idle_node_on_another_host_costs_host_hours(tmp_path):
    """From a ledger alone: a window whose cluster had nodes on hosts a and b, with only a's node
    working, is two hosts' worth of host-hours (b idle still costs), and b's node is listed idle."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run("r", "sweep", {}, {}, "c")
    ledger.start_segment("r", 1, "N1")
    t0 = time.time()
    ledger.db.execute("UPDATE segments SET started = ?, ended = ? WHERE run_id = 'r'", (t0, t0 + 3600))
    for seq in range(40):
        ledger.record(AttemptRecord(run_id="r", seq=seq, task="t", substrate="process", env="coding", policy="p",
                                    executor="ray", host="a", window="N1", concurrency=1, outcome=Outcome.SUCCESS,
                                    reward=1.0, t_start=t0 + seq * 80, t_end=t0 + seq * 80 + 1,
                                    extra={"node": "node-a"}))
    ledger.db.execute("UPDATE segments SET ended = ? WHERE run_id = 'r'", (t0 + 3600,))
    artifacts.put(ledger, "r", "N1", SegmentArtifact(concurrency=1, planned_s=3600, max_attempts=None,
                                                      work_started=t0, ended=t0 + 3600, interrupted=False,
                                                      config={}, resources={}))
    crit = Criteria(invalid_threshold=0.01, stability=1.0)
    alone = judge(ledger, "r", "N1", crit)
    assert alone.host_count == 1 and alone.valid_per_host_hour.value == pytest.approx(40)
    artifacts.put(ledger, "r", "N1", ClusterArtifact(nodes=[
        ClusterNode(node_id="node-a", host="a", at_start=True, at_end=True),
        ClusterNode(node_id="node-b", host="b", at_start=True, at_end=True)]))
    v = judge(ledger, "r", "N1", crit)
    assert v.host_count == 2 and v.valid_per_host_hour.value == pytest.approx(20)
    assert [(ln.node_id, ln.attempts, ln.finished) for ln in v.nodes] == [("node-a", 40, True), ("node-b", 0, True)]
    assert v.nodes[0].valid_per_node_hour.value == pytest.approx(40)
    assert next(c for c in v.checks if c.name == "nodes").passed
    assert usage(ledger, "r", ["N1"]).host_seconds == pytest.approx(2 * 3600)
    # node b gone by the end of the window: not confirmed, with the reason
    artifacts.put(ledger, "r", "N1", ClusterArtifact(nodes=[
        ClusterNode(node_id="node-a", host="a", at_start=True, at_end=True),
        ClusterNode(node_id="node-b", host="b", at_start=True, at_end=False)]))
    v = judge(ledger, "r", "N1", crit)
    gone = next(c for c in v.checks if c.name == "nodes")
    assert not v.confirmed and not gone.passed and "node node-b on b lost mid-window" in gone.detail
