"""``branch --executor ray`` on a real 3-node Ray cluster on loopback (``ray.cluster_utils.Cluster``;
every process carries ``ray_env``'s loopback settings, set by ``loopback_cluster``).

The prepared state (replay's actions, the overlay snapshot's frozen layers) is made once on the
driver's node and travels as bytes through Ray's object store; each node makes, checks and runs its
continuations on an overlay substrate of its own.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import pytest
from rich.console import Console

from drumsbench.core.errors import UsageError
from drumsbench.executors import ray_env
from drumsbench.executors.ray import missing as ray_missing
from drumsbench.executors.ray_branch import BranchCluster, BranchSpec
from drumsbench.executors.ray_env import processes_with_tmpdir
from drumsbench.experiments.branch import BranchConfig, _continuation_policy, ray_problems, run_branch
from drumsbench.ledger import Ledger
from drumsbench.report.tables import branch_group
from drumsbench.substrates.overlay.sandbox import OverlaySubstrate
from drumsbench.substrates.process import RUN_VAR

from conftest import require
from helpers import cli

MiB = 1024 * 1024


@contextlib.contextmanager
def patient_cluster(extra_nodes: int):
    """``test_ray.loopback_cluster`` with Ray's default health checks, a longer wait for the nodes and
    up to three starts: nothing here kills a node, and on the 2-core machine at load 50 the fast
    check (1 s) marked live raylets dead and a raylet missed Ray's fixed 30-s start-up wait. Head
    (1 CPU) + ``node_2``... (1 CPU each), object stores of 80 MiB, this process connected as the
    driver; no Ray process and no Ray folder left after, also when a start fails."""
    require(ray_missing())
    imported = "ray" in sys.modules
    env = ray_env.apply()
    import ray
    from ray.cluster_utils import Cluster

    if imported:
        ray_env.reload_auth()
    c = None
    try:
        for attempt in range(3):
            try:
                c = Cluster(initialize_head=True, head_node_args={
                    "node_ip_address": ray_env.LOOPBACK, "num_cpus": 1, "object_store_memory": 80 * MiB,
                    "include_dashboard": False})
                for i in range(2, 2 + extra_nodes):
                    c.add_node(node_ip_address=ray_env.LOOPBACK, num_cpus=1, resources={f"node_{i}": 1},
                               object_store_memory=80 * MiB)
                ray.init(address=c.address, _node_ip_address=ray_env.LOOPBACK, logging_level="WARNING")
                c.wait_for_nodes(timeout=180)
                break
            except Exception:
                if attempt == 2:
                    raise
                ray.shutdown()
                if c is not None:
                    c.shutdown()
                c = None
                ray_env.reap(env.tmpdir)
        yield c, env
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        env.restore(remove_folder=False)
        deadline = time.monotonic() + 30  # helpers may take seconds to exit after shutdown at this load
        while (left := processes_with_tmpdir(env.tmpdir)) and time.monotonic() < deadline:
            time.sleep(0.5)
        env.restore()
        assert not left, f"Ray processes left behind: {left}"


@pytest.fixture(scope="module")
def cluster3():
    """Head + ``node_2`` + ``node_3`` on 127.0.0.1."""
    require(OverlaySubstrate.missing())
    with patient_cluster(2) as (c, env):
        yield c, env


def _leftovers(state_dir) -> list[str]:
    """Overlay folders and processes of any run under ``state_dir`` (driver's and nodes' run ids)."""
    from drumsbench.substrates.hostproc import pids_with_env

    folders = [str(p) for p in (state_dir / "overlay").glob("*")] if (state_dir / "overlay").exists() else []
    procs = [str(p) for run in ("rb", "rb-head", "rb-node_2", "rb-node_3") for p in pids_with_env(RUN_VAR, run)]
    return folders + procs


def test_branch_on_ray_ships_the_prepared_state_and_continues_on_every_node(cluster3, tmp_path, state_dir):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run("rb", "branch", {}, {}, "test")
    sub = OverlaySubstrate("rb", state_dir)
    cfg = BranchConfig(substrate="overlay", k=3, ks=[3], continuations=3, methods=["replay", "snapshot"],
                       policy="oracle", executor="ray")
    try:
        report = run_branch(cfg, sub, ledger, "rb")
    finally:
        sub.close()
    assert report.executor == "ray" and report.prepared_unchanged and report.isolation_control_fired
    controls = ledger.db.execute("SELECT fired FROM controls WHERE run_id = 'rb'").fetchall()
    assert len(controls) == 4 and all(f for (f,) in controls)  # the driver's and one per node
    by = {m.method: m for m in report.methods}
    for m in report.methods:
        assert m.executor == "ray" and not m.errors, m.errors
        assert m.faithful_all.value == 1.0 and m.valid == 3 and m.continuations == 3, m
        assert {n.label for n in m.nodes} == {"head", "node_2", "node_3"}
        assert sum(n.continuations for n in m.nodes) == 3
        assert sum(n.continuations > 0 for n in m.nodes) >= 2  # continuations on two nodes or more
        assert all(n.faithful_all.faithful == n.continuations for n in m.nodes)
        # the transfer is measured on every node and reported apart from creation
        assert m.shipped_bytes and m.put_s is not None and m.pack_s is not None
        assert all(n.transfer_s > 0 and n.unpack_s >= 0 for n in m.nodes)
        assert len(m.creation_parallel.samples_s) == 3
    # the snapshot ships the frozen layer with the work tree; replay ships only its 3 actions
    assert by["snapshot"].shipped_bytes > by["replay"].shipped_bytes
    rows = [json.loads(e) for (e,) in ledger.attempts("rb", ("extra",))]
    assert len(rows) == 6
    for name in ("replay", "snapshot"):
        mine = [e for e in rows if e["fork_method"] == name]
        assert len({e["node"] for e in mine}) >= 2 and all(e["faithful"] == {"files": True} for e in mine)
    assert not _leftovers(state_dir)
    console = Console(width=250, record=True)
    console.print(branch_group(report, cfg.ks))
    table = console.export_text()
    assert "transfer to each node (ms, apart from creation)" in table and "node_3" in table


def test_an_unfaithful_continuation_is_caught_on_its_node(cluster3, tmp_path, state_dir):
    """The node's faithfulness check can fail: continuations compared with a prepared state that is
    not theirs are reported unfaithful and recorded invalid (dirty_reset) on every node."""
    from drumsbench.branching.methods import Replay
    from drumsbench.envs import suites

    suite = suites.load("coding")
    task = suite.tasks[0]
    cfg = BranchConfig(k=2, policy="oracle")
    spec = BranchSpec(run_id="rbx", task=task, make_env=suite.make_env, policy=_continuation_policy(cfg),
                      rollout=cfg.rollout, seed=0, k=2, prepared={"files": "not-the-prepared-tree"}, parent="none",
                      substrate_cls=OverlaySubstrate, driver_host="", driver_state_dir=str(state_dir))
    results = []
    with BranchCluster(None, spec, lambda _line: None) as cluster:
        assert all(fired for fired, _ in cluster.controls) and len(cluster.nodes) == 3
        replay = Replay(OverlaySubstrate("unused", state_dir), suite.make_env, task, task.branch_prefix(2), 30)
        shipped, errors = cluster.ship("replay", replay.pack())
        assert not errors and len(shipped.per_node) == 3
        errors = cluster.continuations("replay", [0, 1], 1, "x", results.append)
        assert not errors
    assert len(results) == 2 and len({r.node_id for r in results}) == 2
    for r in results:
        assert r.faithful == {"files": False}
        assert r.record is not None and r.record.cause is not None and r.record.cause.value == "dirty_reset"
    assert not cluster.leftovers


def test_bad_flags_are_one_line_and_record_no_run(tmp_path):
    require(ray_missing())
    state = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = str(tmp_path / "runs")
    bad = {
        ("--ray-address", "127.0.0.1:1"): "--ray-address: only with --executor ray",
        ("--executor", "ray", "--methods", "snapshot"): "--methods snapshot: substrate process cannot ship",
    }
    for args, message in bad.items():
        proc = cli("branch", *args, "--out", out, env=state)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (args, proc.stderr)
    with pytest.raises(UsageError, match=r"^--ks: with --executor ray only the branch point is measured"):
        ray_problems(BranchConfig(k=5, ks=[1, 5], executor="ray"), OverlaySubstrate)
    ledger = tmp_path / "runs" / "ledger.sqlite"
    assert not ledger.exists() or not Ledger(ledger).db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def test_branch_cli_joins_the_cluster(cluster3, tmp_path):
    """``drumsbench branch --executor ray --ray-address`` as a user runs it (the token file comes from
    the environment ``ray_env.apply`` set here): continuations on two nodes, the transfer row shown."""
    c, _ = cluster3
    proc = cli("branch", "--executor", "ray", "--ray-address", c.address, "--substrate", "overlay",
               "--methods", "snapshot", "--k", "2", "--continuations", "2", "--policy", "oracle",
               "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "b.json"), "--no-progress",
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")}, check=True)
    data = json.loads((tmp_path / "b.json").read_text())
    (m,) = data["methods"]
    assert data["executor"] == "ray" and m["valid"] == 2 and m["faithful_all"]["faithful"] == 2
    assert len({n["label"] for n in m["nodes"] if n["continuations"]}) == 2
    assert "transfer to each node (ms, apart from creation)" in proc.stdout
    assert not list((tmp_path / "state" / "overlay").glob("*/*"))
