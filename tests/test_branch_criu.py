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
    # creation is the restore's cost wherever it was paid (the pool's restores made ahead of demand
    # count their phases), the hand-over is its own figure: the pool is full when prepare returns, so
    # at least the first continuation was made ahead. No speed assertion (benchmarks/criu_fork.py).
    assert crus.handover_sequential is not None and crus.made_ahead >= 1, crus
    restore = crus.creation_phases["restore_s"].value
    assert restore and crus.creation_sequential.p50.value >= restore  # each creation includes its restore
    assert crus.capture is not None and crus.capture.n == cfg.continuations
    (ratio,) = report.ratios
    assert ratio.method == "criu" and ratio.end_to_end.value is not None and ratio.creation.value is not None
    for m in report.methods:
        print(m.method, "creation p50", m.creation_sequential.p50.value, "parallel p50",
              m.creation_parallel.p50.value, "faithful", {d: e.value for d, e in m.faithful.items()}, m.errors)
    assert not list(pids_with_env("DRUMSBENCH_RUN", run_id)), "a continuation outlived the experiment"
    assert not sub.leftovers(), sub.leftovers()
    sub.close()
