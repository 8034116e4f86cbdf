"""Branch from a prepared state (coding environment): forks are faithful or caught, continuations
are recorded with their method and parent, and the prepared state is never changed by its forks."""

from __future__ import annotations

import json
import time

import pytest
from rich.console import Console

from drumsbench.branching.methods import METHODS, FileCopy, ForkCost
from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import BranchSummaryArtifact
from drumsbench.measure.stats import rate_ratio
from drumsbench.report.tables import branch_group
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
    for m in report.methods:
        # made on demand: the caller waited the whole creation, and nothing was made ahead
        assert m.handover_sequential is not None and m.made_ahead == 0
        assert m.handover_sequential.samples_s == m.creation_sequential.samples_s
        assert m.capture is not None and m.capture.n == 3  # the faithfulness check of every continuation
        assert len(m.valid_times_s) == m.valid and m.span_s and max(m.valid_times_s) <= m.span_s
    assert all(e["creation_s"] == e["handover_s"] and not e["made_ahead"] for e in extra)
    replay, file = report.methods
    (ratio,) = report.ratios
    assert (ratio.method, ratio.baseline) == ("file", "replay")
    # end to end = the two methods' valid continuations per host-hour, divided, with its own interval
    assert ratio.end_to_end == rate_ratio(file.valid_times_s, file.span_s, replay.valid_times_s, replay.span_s)
    assert abs(ratio.end_to_end.value - file.valid_per_host_hour.value / replay.valid_per_host_hour.value) < 1e-9
    assert ratio.end_to_end.low <= ratio.end_to_end.value <= ratio.end_to_end.high
    assert abs(ratio.creation.value - replay.creation_sequential.p50.value / file.creation_sequential.p50.value) < 1e-9
    # a ledger written before these fields existed still reads, and its table says what its creation was
    old = report.model_dump(mode="json", by_alias=True)
    old.pop("ratios")
    for m in old["methods"]:
        for f in ("handover_sequential", "handover_parallel", "made_ahead", "made_ahead_parallel",
                  "creation_phases", "capture", "span_s", "valid_times_s"):
            m.pop(f)
    back = BranchSummaryArtifact.model_validate(old)
    assert back.methods[0].handover_sequential is None and back.ratios == []
    console = Console(width=250, record=True)
    console.print(branch_group(back, [1, 5]))
    text = console.export_text()
    assert "wall time of fork()" in text and "creation time" not in text.split("┘")[-1]


class AheadCopy(FileCopy):
    """A file fork that makes its continuations ahead of demand (as criu's pool does): creation is
    what making each one cost at ``prepare``, the hand-over what ``fork`` cost the caller."""

    name = "ahead"

    def prepare(self, parent):
        super().prepare(parent)
        self.ready, self.made = [], {}
        for _ in range(2):
            t0 = time.monotonic()
            slot = super().fork(parent.env.generation)
            self.made[id(slot)] = time.monotonic() - t0
            self.ready.append(slot)

    def fork(self, parent_generation):
        return self.ready.pop(0) if self.ready else super().fork(parent_generation)

    def fork_cost(self, slot, wall_s):
        made = self.made.pop(id(slot), None)
        return super().fork_cost(slot, wall_s) if made is None else ForkCost(made, wall_s, ahead=True)

    def close(self):
        for slot in self.ready:
            slot.destroy()


def test_creation_is_paid_where_it_is_made_and_hand_over_apart(ledger, state_dir, monkeypatch):
    """Continuations made ahead of demand report the cost of making them as creation, the caller's
    wait as the hand-over; the ones made on demand (the pool ran dry) the wall time for both."""
    monkeypatch.setitem(METHODS, "ahead", AheadCopy)
    cfg = BranchConfig(continuations=3, ks=[5], methods=["ahead"])
    report = _branch(cfg, state_dir, ledger)
    (m,) = report.methods
    assert m.made_ahead == 2 and m.valid == 3 and not m.errors, m
    extra = [json.loads(r[0]) for r in ledger.attempts("b", ("extra",))]
    assert [e["made_ahead"] for e in extra] == [True, True, False]
    assert [e["creation_s"] for e in extra] == m.creation_sequential.samples_s
    assert [e["handover_s"] for e in extra] == m.handover_sequential.samples_s
    ahead = [e for e in extra if e["made_ahead"]]
    assert all(e["creation_s"] != e["handover_s"] for e in ahead)  # two different clocks
    assert extra[2]["creation_s"] == extra[2]["handover_s"]  # made while the caller waited
    assert report.ratios == []  # no replay to compare with


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
    out = " ".join(proc.stdout.split())  # rich wraps long lines at the terminal's width
    assert "replay / file creation time (restore included)" in out
    assert "file / replay valid continuations per host-hour (end to end)" in out
    assert "hand-over p50" in out and "faithfulness check p50" in out
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


def test_a_method_states_what_it_needs_and_the_run_refuses_before_preparing(tmp_path):
    """``ForkMethod.requires``: checked against the substrate's class and the suite's environment
    before any sandbox exists; a misfit is one line (exit 2) and records no run."""
    from drumsbench.envs.coding.env import CodingEnv
    from drumsbench.envs.desktop.env import DesktopEnv
    from drumsbench.substrates import registry

    process, overlay, podman = (registry.get(n) for n in ("process", "overlay", "podman"))
    for name in ("replay", "file"):
        assert METHODS[name].unmet(process, CodingEnv) is None and METHODS[name].unmet(podman, DesktopEnv) is None
    assert METHODS["snapshot"].unmet(overlay, CodingEnv) is None
    assert METHODS["snapshot"].unmet(process, CodingEnv) == (
        "needs a substrate that is Forking and sandboxes that are Snapshotting, which --substrate process "
        "with the coding environment lacks")
    assert METHODS["criu"].requires().unmet(process, DesktopEnv) == []
    assert METHODS["criu"].requires().unmet(podman, CodingEnv) == [
        "sandboxes that are ProcessSandbox", "an environment that is DesktopEnv"]
    assert METHODS["podman-checkpoint"].requires().unmet(podman, DesktopEnv) == []
    assert "a substrate that is PodmanSubstrate" in METHODS["podman-checkpoint"].requires().unmet(process, DesktopEnv)

    state = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "runs"
    bad = {("--methods", "snapshot"): "--methods snapshot: needs a substrate that is Forking",
           ("--methods", "replay,criu"): "--methods criu: needs an environment that is DesktopEnv"}
    for args, message in bad.items():
        proc = cli("branch", *args, "--substrate", "process", "--out", str(out), "--no-progress", env=state)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    ledger = out / "ledger.sqlite"
    assert not ledger.exists() or not Ledger(ledger).db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert not list((tmp_path / "state").glob("process/*/*"))  # no sandbox was made
