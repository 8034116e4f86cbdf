"""Branch from a prepared state (coding environment): forks are faithful or caught, continuations
are recorded with their method and parent, and the prepared state is never changed by its forks."""

from __future__ import annotations

import json

import pytest

from drumsbench.branching.methods import METHODS, FileCopy
from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.substrates.process import ProcessSubstrate

from helpers import cli


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.create_run("b", "branch", {}, {}, "test")
    return led


def _branch(cfg, state_dir, ledger):
    """``run_branch`` on a process substrate that is closed afterwards (nothing of the run stays)."""
    sub = ProcessSubstrate("b", state_dir)
    try:
        return run_branch(cfg, sub, ledger, "b")
    finally:
        sub.close()


def test_replay_and_file_continuations(ledger, state_dir):
    cfg = BranchConfig(continuations=3, ks=[1, 5], methods=["replay", "file"], growth_forks=2)
    report = _branch(cfg, state_dir, ledger)
    assert report.prepared_unchanged and report.isolation_control_fired
    for m in report.methods:
        assert m.faithful_all.value == 1.0, m
        assert m.valid == 3 and not m.errors
        assert set(m.creation_by_k) == {"1", "5"}
    rows = ledger.attempts("b", ("window", "extra", "outcome"))
    assert len(rows) == 6
    extra = [json.loads(r[1]) for r in rows]
    assert {e["fork_method"] for e in extra} == {"replay", "file"}
    assert all(e["k"] == 5 and e["parent"] and e["faithful"] == {"files": True} for e in extra)


class LossyCopy(FileCopy):
    """A file fork that loses the agent's notes: the faithfulness gate must catch it."""

    name = "lossy"

    def prepare(self, parent):
        super().prepare(parent)
        self.files = {p: d for p, d in self.files.items() if not p.startswith("notes/")}


def test_unfaithful_continuation_is_invalid_and_never_used(ledger, state_dir, monkeypatch):
    monkeypatch.setitem(METHODS, "lossy", LossyCopy)
    cfg = BranchConfig(continuations=2, ks=[5], methods=["lossy"])
    report = _branch(cfg, state_dir, ledger)
    m = report.methods[0]
    assert m.faithful["files"].value == 0.0
    assert m.valid == 0 and m.invalid == {"dirty_reset": 2}
    outcomes = ledger.attempts("b", ("outcome", "cause", "reward"))
    assert outcomes == [("invalid", "dirty_reset", None)] * 2


def test_branch_cli(tmp_path):
    proc = cli("branch", "--continuations", "2", "--ks", "1,5", "--out", str(tmp_path / "runs"),
               "--json", str(tmp_path / "b.json"), env={"DRUMSBENCH_STATE": str(tmp_path / "state")}, check=True)
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["schema"] == "drumsbench.branch-report/2"
    assert [m["method"] for m in data["methods"]] == ["replay", "file"]
    assert "replay / file creation time" in proc.stdout
    bad = cli("branch", "--methods", "teleport", "--out", str(tmp_path / "runs"),
              env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert bad.returncode == 2 and "unknown fork method 'teleport'" in bad.stderr


def test_desktop_branch_reports_file_losses(ledger, state_dir):
    """LibreOffice branched after k=3 oracle actions: replay reproduces every dimension; a file copy
    loses what lived only in the process (undo, selection, modified flag) and is reported unfaithful."""
    from drumsbench.envs.desktop import instance

    from conftest import require

    require(instance.missing())
    cfg = BranchConfig(tasks="desktop", k=3, ks=[3], continuations=1, methods=["replay", "file"])
    report = _branch(cfg, state_dir, ledger)
    replay, file = report.methods
    assert replay.faithful_all.value == 1.0 and replay.valid == 1, replay
    assert file.faithful_all.value == 0.0 and file.invalid == {"dirty_reset": 1}
    lost = {d for d, e in file.faithful.items() if e.value == 0.0}
    assert {"undo", "modified"} <= lost, lost
    assert report.prepared_unchanged


def test_overlay_snapshot_continuations(ledger, state_dir):
    """The substrate's own O(1) snapshot/fork as a fork method: faithful, and forks never touch the parent."""
    from drumsbench.substrates.overlay.sandbox import OverlaySubstrate

    from conftest import require

    require(OverlaySubstrate.missing())
    sub = OverlaySubstrate("b", state_dir)
    try:
        report = run_branch(BranchConfig(continuations=2, ks=[5], methods=["snapshot"]), sub, ledger, "b")
    finally:
        sub.close()
    m = report.methods[0]
    assert m.faithful_all.value == 1.0 and m.valid == 2 and not m.errors, m
    assert report.prepared_unchanged


def test_desktop_stale_lock_in_a_file_continuation_is_caught(ledger, state_dir, monkeypatch):
    """A file-method continuation that ends up with a lock naming another host (as a copy made
    elsewhere carries) is caught by the faithfulness gate: invalid, never continued."""
    from drumsbench.envs.desktop import instance
    from drumsbench.envs.desktop.task import lock_name

    from conftest import require

    require(instance.missing())

    class StaleLockCopy(FileCopy):
        name = "stale-lock-copy"

        def fork(self, parent_generation):
            slot = super().fork(parent_generation)
            doc = self.task.document  # type: ignore[attr-defined]
            slot.sandbox.write_file(f"{slot.sandbox.paths.work}/{lock_name(doc)}",
                                    b",someone,other-host,01.01.2024 00:00,file:///elsewhere;")
            return slot

    monkeypatch.setitem(METHODS, "stale-lock-copy", StaleLockCopy)
    cfg = BranchConfig(tasks="desktop", k=3, ks=[3], continuations=1, methods=["stale-lock-copy"])
    report = _branch(cfg, state_dir, ledger)
    m = report.methods[0]
    assert m.faithful["locks"].value == 0.0, m.faithful
    assert m.invalid == {"dirty_reset": 1} and m.valid == 0
