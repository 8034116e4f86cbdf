"""The desktop environment inside a VM guest (``vm``; docs/desktop.md, "Where it runs").

Through the real environment and rollout, on forks of the desktop guest's booted snapshot (QEMU,
software emulation here): the oracle succeeds and the null policy fails; the gates hold (a black
screen and a frozen one are ``bad_observation``, a planted stale lock is ``dirty_reset``); a
policy's shell action is not offered (the guest's commands run as its root) and asking for one is
the policy's failure; nothing is left afterwards (QEMU processes, sandbox folders, sockets in the
host's /tmp). One module-wide sandbox pool keeps the cost to one start per attempt (about 25 s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_desktop_substrates import CFG, _slot, assert_gates, attempt

from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import ActionSpec, Environment
from drumsbench.envs.desktop import guest
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.policies import replay
from drumsbench.policies.scripted import Null, Oracle
from drumsbench.substrates.base import HostFolders

assert CFG.step_timeout_s >= 20  # a guest's grab waits up to 10 s for a stopped X server


@pytest.fixture
def vm_slot(desktop_ready, state_dir, run_id, tmp_path):
    yield from _slot("vm", state_dir, run_id, tmp_path)


def test_oracle_null_gates_and_shell_in_a_guest(vm_slot):
    env = vm_slot.env
    assert isinstance(env, DesktopEnv)
    oracle = attempt(vm_slot, "writer-fix-typo", Oracle(), seq=0)
    assert oracle.outcome is Outcome.SUCCESS, oracle.detail
    assert isinstance(env.inst, guest.GuestInstance) or env.inst is None
    null = attempt(vm_slot, "writer-fix-typo", Null(), seq=1)
    assert null.outcome is Outcome.FAILED, null.detail
    shots = env.artifact_dir / "screenshots" / vm_slot.substrate.run_id / "writer-fix-typo"
    assert {p.name for p in shots.glob("*.png")} == {"start.png", "middle.png", "end.png"}

    assert_gates(vm_slot, seq=2)  # black, frozen (the guest's X server stopped), stale lock

    # the guest's commands run as its root: a policy's shell action is refused, its own failure
    asks = replay.Replay([ActionSpec("shell", {"command": "pkill -9 Xvfb; touch /sandbox/work/mine"}),
                          ActionSpec("wait", {"seconds": 0.5})])
    rec = attempt(vm_slot, "writer-fix-typo", asks, seq=5)
    assert rec.outcome is Outcome.FAILED and rec.cause is None, (rec.outcome, rec.cause, rec.detail)
    assert "shell actions are not offered on vm" in rec.detail or rec.detail


def test_a_guest_framebuffer_file_parses_as_xvfb_writes_it():
    """Xvfb's ``-fbdir`` file: a big-endian XWD header, a colour map, then BGRX rows."""
    w, h, ncolors = 3, 2, 2
    header_size = 100 + 8
    fields = [header_size, 7, 2, 24, w, h, 0, 0, 32, 0, 32, 32, w * 4, 4, 0xFF0000, 0xFF00, 0xFF, 8, 256, ncolors,
              w, h, 0, 0, 0]
    head = guest.XWD_HEADER.pack(*fields) + b"Xvfb 0\0\0"
    pixels = bytes(range(w * h * 4))
    rgb = guest.parse_xwd(head + b"\0" * 12 * ncolors + pixels)
    assert rgb.shape == (h, w, 3)
    assert rgb[0, 0].tolist() == [2, 1, 0] and rgb[1, 2].tolist() == [22, 21, 20]  # BGRX -> RGB
    with pytest.raises(Exception, match="32-bit"):
        guest.parse_xwd(guest.XWD_HEADER.pack(*fields[:11], 16, *fields[12:]) + b"\0" * 64)
    assert np.array_equal(rgb, guest.parse_xwd(head + b"\0" * 12 * ncolors + pixels + b"tail"))


def test_the_guest_blank_waits_for_the_x_server_and_takes(desktop_ready, tmp_path):
    """``BLANK_SCRIPT`` as the guest runs it, against an Xvfb of the host's: it exits 0 only once the
    server has answered with the settings it sent (its round trip: a client that hangs up without one
    may have its requests dropped unread), and the screen saver's window then covers the framebuffer
    with the root's black background."""
    import subprocess
    import time

    from drumsbench.envs.desktop.instance import SYSTEM_PYTHON, _free_display

    n = _free_display()
    xvfb = subprocess.Popen(["Xvfb", f":{n}", "-nolock", "-nolisten", "tcp", "-screen", "0", "64x48x24",
                             "-fbdir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            assert xvfb.poll() is None and time.monotonic() < end, "Xvfb did not come up"
            time.sleep(0.05)
        res = subprocess.run([SYSTEM_PYTHON, "-I", "-c", guest.BLANK_SCRIPT % n], capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr.decode()
        rgb = guest.parse_xwd((tmp_path / "Xvfb_screen0").read_bytes())
        assert rgb.shape == (48, 64, 3) and not rgb.any()
    finally:
        xvfb.terminate()
        xvfb.wait(30)


def test_an_environment_is_refused_up_front_where_its_needs_are_not_met(monkeypatch, run_id):
    """An environment whose needs a substrate's sandboxes lack is refused before any sandbox is made
    (one line naming the substrate and the ones that fit; never a run of invalid attempts). The
    built-in desktop now runs everywhere, so an environment needing host folders stands in."""
    from drumsbench.experiments.run import make_substrate

    monkeypatch.setattr(DesktopEnv, "requires", (HostFolders,))
    monkeypatch.setattr(DesktopEnv, "unmet", classmethod(Environment.unmet.__func__))  # type: ignore[attr-defined]
    with pytest.raises(UsageError) as e:
        make_substrate("vm", run_id, "desktop")
    line = str(e.value)
    assert "\n" not in line and line.startswith("--substrate vm: the desktop environment needs sandboxes that are "
                                                "HostFolders")
    assert "choose process" in line and "vm" not in line.split("choose", 1)[1]


def test_a_live_desktop_forks_with_its_vm(desktop_ready, tmp_path, state_dir, run_id):
    """The vm's shared-RAM fork of the whole running machine (``--methods snapshot``): each
    continuation takes over the running LibreOffice the fork copied (``MachineForks``) and is
    faithful on every dimension; nothing is left (QEMU processes, live snapshots, folders)."""
    from drumsbench.experiments.branch import BranchConfig, run_branch
    from drumsbench.ledger import Ledger
    from drumsbench.substrates.vm.sandbox import VmSubstrate

    from conftest import require

    require(VmSubstrate.missing())
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run(run_id, "branch", {}, {}, "test")
    sub = VmSubstrate(run_id, state_dir)
    sub.use_flavor(DesktopEnv.image_flavor)
    try:
        cfg = BranchConfig(tasks="desktop", task="writer-bold-word", substrate="vm", k=3, ks=[], continuations=2,
                           methods=["snapshot"], policy="oracle")
        report = run_branch(cfg, sub, ledger, run_id)
        (snap,) = report.methods
        assert snap.method == "snapshot" and snap.valid == cfg.continuations, snap
        assert snap.faithful_all.value == 1.0 and all(e.value == 1.0 for e in snap.faithful.values()), snap.faithful
        assert report.prepared_unchanged
        print("snapshot creation p50", snap.creation_sequential.p50.value, "s; errors", snap.errors)
    finally:
        sub.close()
    assert not sub.leftovers(), sub.leftovers()
