"""Desktop branching with CRIU: live continuations restored from a checkpoint of the running
LibreOffice are faithful on every dimension and leave nothing behind (their speed against replay
is benchmarks/criu_fork.py's)."""

from __future__ import annotations

import pytest

from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.substrates.process import ProcessSubstrate, pids_with_env


@pytest.fixture
def ledger(tmp_path, run_id):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.create_run(run_id, "branch", {}, {}, "test")
    return led


def test_desktop_criu_fork(ledger, state_dir, run_id):
    """(A run id of its own: the leftover check is host-wide, and a fixed id once found what an
    earlier, killed run of this test had left.)"""
    from drumsbench.branching import criu_binary as criu_install
    from drumsbench.envs.desktop import instance

    from conftest import require

    require(instance.missing())
    require(criu_install.missing())
    cfg = BranchConfig(tasks="desktop", k=5, ks=[], continuations=2, methods=["replay", "criu"])
    sub = ProcessSubstrate(run_id, state_dir)
    report = run_branch(cfg, sub, ledger, run_id)
    replay, crus = report.methods
    assert (replay.method, crus.method) == ("replay", "criu")
    assert replay.valid == cfg.continuations and replay.faithful_all.value == 1.0, replay  # the baseline beside it
    assert crus.faithful_all.value == 1.0, crus
    assert crus.valid == cfg.continuations, crus
    assert all(e.value == 1.0 for e in crus.faithful.values()), crus.faithful
    assert report.prepared_unchanged
    # no speed assertion: criu's creation is a hand-over from its pool of continuations restored
    # ahead of demand (microseconds); benchmarks/criu_fork.py measures cold restores beside replay
    for m in report.methods:
        print(m.method, "creation p50", m.creation_sequential.p50.value, "parallel p50",
              m.creation_parallel.p50.value, "faithful", {d: e.value for d, e in m.faithful.items()}, m.errors)
    assert not list(pids_with_env("DRUMSBENCH_RUN", run_id)), "a continuation outlived the experiment"
    assert not sub.leftovers(), sub.leftovers()
    sub.close()
