"""Desktop branching with CRIU: live continuations restored from a checkpoint of the running
LibreOffice are faithful on every dimension and much faster to create than replay."""

from __future__ import annotations

import pytest

from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.substrates.process import ProcessSubstrate, pids_with_env


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.create_run("bc", "branch", {}, {}, "test")
    return led


def test_desktop_criu_fork(ledger, state_dir):
    from drumsbench.branching import criu_binary as criu_install
    from drumsbench.envs.desktop import instance

    from conftest import require

    require(instance.missing())
    require(criu_install.missing())
    cfg = BranchConfig(tasks="desktop", k=5, ks=[], continuations=2, methods=["replay", "criu"])
    sub = ProcessSubstrate("bc", state_dir)
    report = run_branch(cfg, sub, ledger, "bc")
    replay, crus = report.methods
    assert crus.method == "criu"
    assert crus.faithful_all.value == 1.0, crus
    assert crus.valid == cfg.continuations, crus
    assert all(e.value == 1.0 for e in crus.faithful.values()), crus.faithful
    assert report.prepared_unchanged
    r, c = replay.creation_sequential.p50.value, crus.creation_sequential.p50.value
    print(f"creation p50: replay {r:.2f} s, criu {c:.2f} s, ratio {r / c:.1f}x")
    assert r / c >= 5, (r, c)
    for m in report.methods:
        print(m.method, "creation p50", m.creation_sequential.p50.value, "parallel p50",
              m.creation_parallel.p50.value, "faithful", {d: e.value for d, e in m.faithful.items()}, m.errors)
    assert not list(pids_with_env("DRUMSBENCH_RUN", "bc")), "a continuation outlived the experiment"
    assert not sub.leftovers(), sub.leftovers()
    sub.close()
