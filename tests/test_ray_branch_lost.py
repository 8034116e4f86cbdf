"""``branch --executor ray`` when a node is lost mid-continuation (a real 3-node loopback cluster;
the node's workers and raylet are SIGKILLed, as when its machine dies).

Its own file: the cluster of ``test_ray_branch.py`` must keep its nodes, and one process holds one
Ray connection at a time.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from test_ray import loopback_cluster, lose_node
from test_ray_desktop import HEALTH

from drumsbench.core.outcome import Outcome
from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.substrates.hostproc import pids_with_env
from drumsbench.substrates.overlay.sandbox import OverlaySubstrate
from drumsbench.substrates.process import RUN_VAR

from conftest import require

RUN = "rbl"
NODE_RUNS = (RUN, f"{RUN}-head", f"{RUN}-node_2", f"{RUN}-node_3")


def test_a_node_lost_mid_continuation_is_recorded_invalid_and_its_share_goes_on(tmp_path: Path,
                                                                              state_dir: Path) -> None:
    """``node_3`` is killed while its first continuation runs: that continuation is recorded once,
    invalid/substrate_failure with ``lost_node``, by the driver; the node's other continuation is
    made by a live node; every other continuation succeeds; the method's errors name the node; and
    nothing of any node's substrate is left (the lost node's removed by the driver)."""
    require(OverlaySubstrate.missing())
    with loopback_cluster(2, HEALTH) as (c, _env, extra):
        node3 = extra[1]
        sandboxes3 = state_dir / "overlay" / f"{RUN}-node_3" / "sb"
        continuing = threading.Event()
        stop = threading.Event()
        killed: list[str] = []

        def say(line: str) -> None:
            if "continuations over" in line:
                continuing.set()
            elif "continuations at once" in line:
                stop.set()

        def kill_node3_mid_continuation() -> None:
            continuing.wait(600)
            while not stop.is_set():
                if sandboxes3.is_dir() and any(sandboxes3.iterdir()):
                    lose_node(c, node3)  # its workers, then its raylet: the continuation cannot hand in
                    killed.append(node3.node_id)
                    return
                stop.wait(0.01)

        killer = threading.Thread(target=kill_node3_mid_continuation, daemon=True)
        killer.start()
        ledger = Ledger(tmp_path / "ledger.sqlite")
        ledger.create_run(RUN, "branch", {}, {}, "test")
        sub = OverlaySubstrate(RUN, state_dir)
        cfg = BranchConfig(substrate="overlay", k=3, ks=[3], continuations=6, methods=["replay"],
                           policy="oracle", executor="ray")
        try:
            report = run_branch(cfg, sub, ledger, RUN, say)
        finally:
            stop.set()
            killer.join(30)
            sub.close()
            if not killed:
                c.remove_node(node3)
        assert killed, "node_3 never ran a continuation"
        cols = ("seq", "outcome", "cause", "reward", "extra", "detail")
        recs = [dict(zip(cols, row, strict=True)) for row in ledger.attempts(RUN, cols)]
        seqs = sorted(r["seq"] for r in recs)
        assert seqs == list(range(seqs[0], seqs[0] + 6)), "a continuation is missing or recorded twice"
        lost = [r for r in recs if json.loads(r["extra"]).get("lost_node")]
        assert len(lost) == 1, [(r["seq"], r["outcome"], r["detail"]) for r in recs]
        extra = json.loads(lost[0]["extra"])
        assert extra["node"] == node3.node_id and extra["node_label"] == "node_3" and extra["fork_method"] == "replay"
        assert (lost[0]["outcome"], lost[0]["cause"], lost[0]["reward"]) == (Outcome.INVALID.value,
                                                                           "substrate_failure", None)
        assert "lost mid-continuation" in lost[0]["detail"]
        others = [r for r in recs if r is not lost[0]]
        assert all(r["outcome"] == Outcome.SUCCESS.value for r in others), [(r["seq"], r["detail"]) for r in others]
        assert all(json.loads(r["extra"])["node_label"] in ("head", "node_2") for r in others)
        (m,) = report.methods
        assert m.valid == 5 and m.invalid == {"substrate_failure": 1}, m
        assert any("node_3" in e and "lost" in e for e in m.errors), m.errors
        assert len(m.creation_parallel.samples_s) == 6  # the parallel phase ran on the live nodes
    folders = [str(p) for p in (state_dir / "overlay").glob("*")] if (state_dir / "overlay").exists() else []
    procs = [p for run in NODE_RUNS for p in pids_with_env(RUN_VAR, run)]
    assert not folders and not procs, (folders, procs)
