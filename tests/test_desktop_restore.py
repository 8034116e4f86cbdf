"""The desktop's reset by restore (``--reset restore``): each task's verified start is checkpointed
once (CRIU) and every reset restores it; the restored state passes the start fingerprint, the
oracle succeeds and the null policy fails as after a cold start; a broken checkpoint falls back to
a cold start, recorded; the images live in the run's sandbox folder and go with the run (and gc).
Speed is measured by ``benchmarks/desktop_restore.py``, not here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drumsbench.core import criu_binary
from drumsbench.core.outcome import Outcome
from drumsbench.envs.desktop import instance
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.task import load_suite
from drumsbench.policies.scripted import Null, Oracle
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.process import ProcessSubstrate, pids_with_env, sandbox_root

from conftest import require

CFG = RolloutConfig(step_timeout_s=20, episode_timeout_s=120, reset="restore")
TASK = next(t for t in load_suite("desktop") if t.id == "writer-bold-word")


@pytest.fixture(scope="module")
def ready():
    require(instance.missing())
    require(criu_binary.missing())
    from drumsbench.envs.desktop.profile import template_profile

    template_profile()


def _attempt(slot: Slot, policy, seq: int):
    return run_attempt(slot, TASK, policy, CFG, CanaryRegistry(), run_id=slot.substrate.run_id, seq=seq, seed=0)


def _images(state_dir: Path, run_id: str) -> list[Path]:
    return sorted(sandbox_root(state_dir, run_id).glob("restore-*"))


def _host_tmp() -> set[str]:
    """Entries of the host's /tmp a desktop instance could leave (the checkpointable spare keeps its
    X socket and LibreOffice's pipes there while it runs); other processes' entries come and go."""
    names = ("OSL_PIPE", ".X", ".ICE", "lu", "criu", "drumsbench", "soffice", "xkb")
    return {p.name for p in Path("/tmp").iterdir() if p.name.startswith(names)}


def test_restore_reset_oracle_null_fallback_and_cleanup(ready, state_dir, run_id):
    tmp_before = _host_tmp()
    sub = ProcessSubstrate(run_id, state_dir)
    slot = Slot(sub, DesktopEnv())
    try:
        first = _attempt(slot, Oracle(), 0)
        assert first.outcome is Outcome.SUCCESS, first.detail
        assert first.extra["reset"] == "restore", first.extra  # the checkpoint was made, then restored
        assert float(first.extra["reset_checkpoint_made_s"]) > 0  # type: ignore[arg-type]
        # the stated gap, in the ledger: root's uid, without capabilities, the host's mounts read-only
        assert first.extra["office"] == ("root's uid on the host without capabilities, its mounts read-only "
                                         "(restored checkpoint)")
        null = _attempt(slot, Null(), 1)
        assert null.outcome is Outcome.FAILED and null.cause is None, null.detail
        again = _attempt(slot, Oracle(), 2)
        assert again.outcome is Outcome.SUCCESS, again.detail
        for rec in (null, again):
            assert rec.extra["reset"] == "restore", rec.extra
            assert "reset_checkpoint_made_s" not in rec.extra  # made once
            assert 0 < float(rec.extra["reset_restore_total_s"]) < rec.reset_s + 1e-6  # type: ignore[arg-type]
            assert float(rec.extra["reset_criu_cpu_s"]) + float(rec.extra["reset_tree_cpu_s"]) > 0  # type: ignore[arg-type]

        # a command in the restored instance works in this sandbox's work folder, not in the folder of the
        # sandbox the checkpoint was made in (nsenter --wd=PATH opened PATH on the host's side)
        assert isinstance(slot.env, DesktopEnv)
        inst = slot.env.instance
        probe = inst.exec_inside(["sh", "-c", "touch wd-probe && pwd"], 20, as_sandbox_user=True)
        assert probe.exit_code == 0, probe
        assert (Path(inst.work) / "wd-probe").exists(), (probe.stdout, inst.work)
        (image,) = _images(state_dir, run_id)  # in the run's own sandbox folder, never the host's /tmp
        assert not str(image).startswith("/tmp/")
        (image / "images" / "pstree.img").unlink()  # a checkpoint that cannot be restored
        cold = _attempt(slot, Oracle(), 3)
        assert cold.outcome is Outcome.SUCCESS, cold.detail
        assert cold.extra["reset"] == "cold" and "restore" in str(cold.extra["reset_fallback"]), cold.extra
        remade = _attempt(slot, Oracle(), 4)  # the broken image was dropped and made again
        assert remade.extra["reset"] == "restore" and "reset_checkpoint_made_s" in remade.extra, remade.extra
        assert remade.outcome is Outcome.SUCCESS, remade.detail
    finally:
        slot.destroy()
        assert isinstance(slot.env, DesktopEnv)
        slot.env.stop()
        sub.close()
    assert _images(state_dir, run_id) == []
    assert not list(pids_with_env("DRUMSBENCH_RUN", run_id)), "a restored instance outlived the run"
    assert sub.leftovers() == []
    assert _host_tmp() - tmp_before == set(), "the spare instance left entries in the host's /tmp"


def test_a_restored_instance_cannot_write_the_host_nor_see_its_other_folders(ready, state_dir, run_id,
                                                                             monkeypatch):
    """A restored LibreOffice runs with root's uid on the host (CRIU gives it back the uid it was
    dumped with, and here can dump no other), so its mount namespace has every host mount read-only
    and the host's non-system folders and the harness's places (the package: its suites' answer
    keys) covered: a GUI Save As into a host folder root could write writes nothing, and a root-only
    file in /srv is not there for it; and it has no capability (``instance.CHECKPOINT_CONFINE``): a
    GUI Open of another uid's file (a neighbour sandbox's) in a folder in sight is refused.
    Positive control: the same restore without those steps, of an instance started with root's
    capabilities (the set-up before 2026-12-04): the same keys write the file and open the
    neighbour's, the same read shows the root-only one."""
    import secrets
    import shutil

    from test_desktop_adversary import gui, save_as

    from drumsbench.core import criu
    from drumsbench.core.answer_keys import harness_places
    from drumsbench.envs.base import ActionSpec
    from drumsbench.envs.desktop import restore

    tag = secrets.token_hex(6)
    folder = Path("/var/lib") / f"drumsbench-probe-{tag}"
    folder.mkdir(mode=0o700)
    secret = Path("/srv") / f"drumsbench-probe-{tag}"
    secret.write_text(f"answer {tag}\n")
    secret.chmod(0o600)
    neighbour = Path("/var/lib") / f"drumsbench-neighbour-{tag}"  # another uid's, as a sandbox's home is
    neighbour.mkdir(mode=0o700)
    (neighbour / "notes.txt").write_text(f"neighbour {tag}\n")
    for entry in (neighbour, neighbour / "notes.txt"):
        os.chown(entry, 54321, 54321)
    sub = ProcessSubstrate(run_id, state_dir)
    slots: list[Slot] = []

    def restored() -> DesktopEnv:
        slot = Slot(sub, DesktopEnv())
        slots.append(slot)
        slot.provision()
        env = slot.env
        assert isinstance(env, DesktopEnv)
        env.reset_by_restore(TASK, sub.create)
        assert env.reset_note["reset"] == "restore", env.reset_note
        return env

    def read(env: DesktopEnv, path: Path) -> str:  # as root, in the instance's mount namespace
        res = env.instance.exec_inside(["cat", str(path)], 20)
        return res.stdout.decode(errors="replace")

    def gui_open(env: DesktopEnv, path: Path) -> str:
        """ctrl+o of ``path``; the active window's title once the dialog is done."""
        gui(env, ActionSpec("key", {"keys": "ctrl+o"}), ActionSpec("wait", {"seconds": 2.5}),
            ActionSpec("key", {"keys": "ctrl+a"}), ActionSpec("type", {"text": str(path)}),
            ActionSpec("key", {"keys": "Return"}), ActionSpec("wait", {"seconds": 3.0}))
        return env.instance.title()

    def office_status(env: DesktopEnv) -> set[str]:
        pids = criu.tree_pids(env.instance.holder_pid)
        return {"".join(line for line in Path(f"/proc/{p}/status").read_text().splitlines(keepends=True)
                        if line.startswith(("Uid:", "CapEff:", "CapBnd:", "NoNewPrivs:")))
                for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "soffice.bin"}

    try:
        env = restored()
        assert os.stat(f"/proc/{env.instance.holder_pid}").st_uid == 0  # root's uid: the mounts are the fence
        (status,) = office_status(env)
        assert "CapEff:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status, status
        assert "NoNewPrivs:\t1" in status and "Uid:\t0\t0\t0\t0" in status, status
        assert "without capabilities" in env.instance.office_runs_as
        assert tag not in read(env, secret)
        listed = env.instance.exec_inside(["ls", "-A", str(harness_places()[0])], 20)
        assert listed.exit_code != 0 or not listed.stdout.strip(), listed  # the package: not in sight
        gui(env, *save_as(f"{folder}/forged.odt"))
        assert list(folder.iterdir()) == []
        gui(env, ActionSpec("key", {"keys": "Escape"}), ActionSpec("key", {"keys": "Escape"}))
        assert "notes.txt" not in gui_open(env, neighbour / "notes.txt")

        # the control: no read-only step, no covers, an instance started with root's capabilities
        # (its own start image)
        monkeypatch.setattr(restore, "READ_ONLY_HOST", "true")
        monkeypatch.setattr(restore, "cover_steps", lambda keep: [])
        monkeypatch.setattr(restore, "IMAGES", restore.StartImages())
        monkeypatch.setattr(instance, "CHECKPOINT_CONFINE", ())  # no drop
        control = restored()
        (status,) = office_status(control)
        assert "CapEff:\t0000000000000000" not in status, status
        assert tag in read(control, secret)
        gui(control, *save_as(f"{folder}/forged.odt"))
        assert (folder / "forged.odt").is_file()
        assert "notes.txt" in gui_open(control, neighbour / "notes.txt")
    finally:
        for slot in slots:
            slot.destroy()
            assert isinstance(slot.env, DesktopEnv)
            slot.env.stop()
        sub.close()
        shutil.rmtree(folder, ignore_errors=True)
        secret.unlink(missing_ok=True)
        shutil.rmtree(neighbour, ignore_errors=True)


def test_gc_removes_the_images_of_a_dead_run(ready, state_dir, run_id):
    sub = ProcessSubstrate(run_id, state_dir)
    slot = Slot(sub, DesktopEnv())
    rec = _attempt(slot, Null(), 0)
    assert rec.extra["reset"] == "restore", rec.extra
    assert _images(state_dir, run_id)
    assert isinstance(slot.env, DesktopEnv)
    slot.env.stop()  # the run "died": its instance is gone, its folders stay
    removed = ProcessSubstrate.gc(state_dir, {run_id})
    assert removed and _images(state_dir, run_id) == [], removed
    sub.close()


def test_reset_restore_is_refused_up_front_where_the_environment_cannot_restore(tmp_path):
    """`--reset restore` on the coding suite: one line naming the flag and the fix, exit 2, no run recorded."""
    import sqlite3

    from helpers import cli

    out = tmp_path / "runs"
    proc = cli("run", "--tasks", "coding", "--reset", "restore", "--attempts", "1", "--out", str(out),
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")}, timeout=120)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--reset restore" in lines[0] and "in_place" in lines[0], \
        proc.stderr
    db = out / "ledger.sqlite"
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
