"""``branch --executor ray --methods criu`` on the desktop: a real 2-node loopback cluster.

The parent LibreOffice is checkpointed on the driver's node; the images and the frozen copy of its
sandbox folder (about 90 MB) travel as bytes through Ray's object store; each node restores live
continuations from them on a process substrate of its own and checks them on every dimension of the
desktop's capture (screen, title, lock files, profile lock, document, undo, text, selection, cursor).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from test_ray import loopback_cluster
from test_ray_desktop import HEALTH

from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.report.tables import branch_group
from drumsbench.substrates.process import RUN_VAR, ProcessSubstrate, pids_with_env

from conftest import require

RUN = "rbc"


def test_desktop_criu_continuations_restore_on_every_node(tmp_path: Path, state_dir: Path) -> None:
    from drumsbench.branching import criu_binary as criu_install
    from drumsbench.envs.desktop import instance
    from drumsbench.envs.desktop.profile import template_profile

    require(instance.missing())
    require(criu_install.missing())
    template_profile()  # cached: the nodes copy it
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run(RUN, "branch", {}, {}, "test")
    cfg = BranchConfig(tasks="desktop", k=5, ks=[5], continuations=2, methods=["criu"], policy="oracle",
                       executor="ray")
    with loopback_cluster(1, HEALTH, store_mib=400):
        sub = ProcessSubstrate(RUN, state_dir)
        try:
            report = run_branch(cfg, sub, ledger, RUN)
        finally:
            sub.close()
        assert not sub.leftovers(), sub.leftovers()
    assert report.executor == "ray" and report.prepared_unchanged and report.isolation_control_fired
    (m,) = report.methods
    assert m.method == "criu" and not m.errors, m.errors
    assert m.valid == 2 and m.success == 2 and m.continuations == 2 and m.faithful_all.value == 1.0, m
    assert all(e.value == 1.0 for e in m.faithful.values()) and {"screen", "locks", "document"} <= set(m.faithful)
    assert {n.label for n in m.nodes if n.continuations} == {"head", "node_2"}  # one continuation on each
    assert m.shipped_bytes and m.shipped_bytes > 10 * 2**20  # the images and the frozen folder
    assert all(n.transfer_s > 0 for n in m.nodes)
    assert len(m.creation_parallel.samples_s) == 2
    rows = [json.loads(e) for (e,) in ledger.attempts(RUN, ("extra",))]
    assert len(rows) == 2 and {r["node_label"] for r in rows} == {"head", "node_2"}
    assert all(all(r["faithful"].values()) for r in rows), rows
    for run in (RUN, f"{RUN}-head", f"{RUN}-node_2"):
        assert not list(pids_with_env(RUN_VAR, run)), f"a continuation of {run} outlived the experiment"
    left = [p for p in (state_dir / "sandboxes").glob("*/*")] if (state_dir / "sandboxes").exists() else []
    assert not left, left
    console = Console(width=250, record=True)
    console.print(branch_group(report, cfg.ks))
    assert "transfer to each node (ms, apart from creation)" in console.export_text()
