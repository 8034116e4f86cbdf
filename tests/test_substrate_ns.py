"""Isolation, reset, snapshot/fork and gc of the namespace substrates (bwrap, overlay)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates import registry
from drumsbench.substrates.hostproc import pids_with_env
from drumsbench.substrates.overlay.forkserver import host_mounts_below
from drumsbench.substrates.overlay.sandbox import OverlaySubstrate, run_folder
from drumsbench.substrates.process import RUN_VAR

from conftest import require

NS_SUBSTRATES = ["bwrap", "overlay"]


@pytest.fixture(params=NS_SUBSTRATES)
def sub(request, run_id, state_dir):
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls(run_id, state_dir)
    yield s
    s.close()
    assert not s.leftovers(), s.leftovers()


@pytest.fixture
def overlay(run_id, state_dir):
    require(OverlaySubstrate.missing())
    s = OverlaySubstrate(run_id, state_dir)
    yield s
    s.close()
    assert not s.leftovers(), s.leftovers()


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- isolation ---------------------------------------------------------------------------------


def test_no_network_but_lo(sub):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        # Positive control: the port is reachable from the host.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        box = sub.create()
        try:
            probe = (
                "import socket; s = socket.socket(); s.settimeout(2); "
                f"s.connect(('127.0.0.1', {port})); print('CONNECTED')"
            )
            res = box.exec(["python3", "-c", probe], timeout=20)
            assert b"CONNECTED" not in res.stdout
            assert res.exit_code != 0
            ifaces = box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", timeout=10)
            assert ifaces.stdout.split() == [b"lo"]
            # lo itself works inside.
            loop = (
                "import socket; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1); "
                "c = socket.create_connection(l.getsockname(), timeout=2); print('LO-OK')"
            )
            assert box.exec(["python3", "-c", loop], timeout=20).stdout == b"LO-OK\n"
        finally:
            box.destroy()
    finally:
        listener.close()


def test_host_files_not_writable(sub, tmp_path):
    token = uuid.uuid4().hex[:10]
    targets = [f"/root/drumsbench-probe-{token}", f"/etc/drumsbench-probe-{token}"]
    a, b = sub.create(), sub.create()
    try:
        b_host = getattr(b, "host_root", None)
        if b_host is not None:  # bwrap: try the other sandbox's host folder too
            targets.append(f"{b_host}/work/evil-{token}")
        for target in targets:
            box_res = a.exec(f"echo x > {target}", timeout=10)
            assert not Path(target).exists(), f"{sub.name} wrote host {target}"
            if sub.name == "bwrap":
                assert box_res.exit_code != 0, f"write to {target} succeeded inside bwrap"
        # Kernel knobs: uid 0 inside must not change them (same value written back).
        knob = a.exec(
            "v=$(cat /proc/sys/vm/swappiness); echo $v > /proc/sys/vm/swappiness", timeout=10
        )
        assert knob.exit_code != 0, "/proc/sys is writable inside"
        # Host folders with secrets or sockets are not visible (bwrap shows the host read-only).
        listing = a.exec("ls -A /root", timeout=10).stdout.split()
        assert b".cache" not in listing, f"host /root is visible: {listing}"
        # The same through the file methods: a link made inside must not lead them to the host.
        secret = tmp_path / "secret.txt"
        secret.write_bytes(b"HOST-SECRET")
        a.exec(f"ln -s {secret} link-read; ln -s {secret} link-write", timeout=10)
        try:
            got = a.read_file(f"{a.paths.work}/link-read")
        except (FileNotFoundError, SubstrateError):
            got = b""
        assert got != b"HOST-SECRET"
        with contextlib.suppress(SubstrateError):
            a.write_file(f"{a.paths.work}/link-write", b"OVERWRITTEN")
        assert secret.read_bytes() == b"HOST-SECRET"
        assert b.exec(f"ls {b.paths.work}", timeout=10).stdout == b""
    finally:
        a.destroy()
        b.destroy()


def test_tmp_is_private(sub):
    name = f"drumsbench-probe-{uuid.uuid4().hex[:10]}"
    host_file = Path("/tmp") / f"{name}-host"
    host_file.write_text("host")
    a, b = sub.create(), sub.create()
    try:
        assert a.exec(f"test -e {host_file}", timeout=10).exit_code != 0, "host /tmp visible"
        assert a.exec(f"echo in > /tmp/{name}", timeout=10).exit_code == 0
        assert not (Path("/tmp") / name).exists(), "sandbox /tmp reached the host's /tmp"
        assert b.exec(f"test -e /tmp/{name}", timeout=10).exit_code != 0, "/tmp shared"
        # /tmp belongs to the sandbox: kept between its commands.
        assert a.exec(f"cat /tmp/{name}", timeout=10).stdout == b"in\n"
    finally:
        host_file.unlink()
        a.destroy()
        b.destroy()


def test_background_process_semantics(sub):
    """bwrap: a command's background processes end with it; overlay: they live on until reset."""
    box = sub.create()
    try:
        box.exec("sleep 30 > /dev/null 2>&1 &", timeout=10)
        res = box.exec("ps -eo args | grep -c '^sleep 30' || true", timeout=10)
        assert res.stdout.strip() == (b"0" if sub.name == "bwrap" else b"1")
    finally:
        box.destroy()


# -- overlay: reset, snapshot, fork --------------------------------------------------------------


def test_overlay_reset_restores_start_state(overlay):
    box = overlay.create()
    fresh = overlay.create()
    try:
        start = {p: box.tree_digest(p) for p in ("/etc", "/sandbox", "/usr/local")}
        box.exec(
            "echo x > work/f; rm /etc/os-release; mkdir -p /usr/local/bin; "
            "echo y > /usr/local/bin/tool; echo z > /tmp/t; (sleep 30 >/dev/null 2>&1 &)",
            timeout=10,
        )
        assert box.tree_digest("/etc") != start["/etc"]
        box.reset_in_place()
        assert {p: box.tree_digest(p) for p in start} == start
        assert {p: fresh.tree_digest(p) for p in start} == start
        probe = box.exec("ls -A /tmp; ps -eo args | grep -c '^sleep 30'", timeout=10)
        assert probe.stdout == b"0\n"
        assert box.exec("cat /etc/os-release", timeout=10).exit_code == 0
    finally:
        box.destroy()
        fresh.destroy()


def test_overlay_snapshot_and_fork(overlay):
    parent = overlay.create()
    try:
        parent.exec("echo 1 > a; echo keep > gone-in-fork; mkdir d; echo 2 > d/b", timeout=10)
        t0 = time.perf_counter()
        snap = parent.snapshot()
        took_snapshot = time.perf_counter() - t0
        assert snap in overlay.snapshots()
        f1, f2 = overlay.fork(snap), overlay.fork(snap)
        try:
            for f in (f1, f2):
                assert f.read_file("/sandbox/work/a") == b"1\n"
                assert f.exec("cat d/b", timeout=10).stdout == b"2\n"
            # Writes and deletes in a fork stay in that fork.
            f1.exec("echo only-f1 > f1.txt; rm gone-in-fork; echo changed > a", timeout=10)
            assert f2.exec("ls", timeout=10).stdout.split() == [b"a", b"d", b"gone-in-fork"]
            assert f2.read_file("/sandbox/work/a") == b"1\n"
            assert parent.exec("ls", timeout=10).stdout.split() == [b"a", b"d", b"gone-in-fork"]
            # The parent goes on after the snapshot; forks do not see its later writes.
            parent.write_file("/sandbox/work/after", b"later")
            for f in (f1, f2):
                with pytest.raises(FileNotFoundError):
                    f.read_file("/sandbox/work/after")
            # A fork's reset returns to the snapshot, not to the empty rootfs.
            f1.reset_in_place()
            assert f1.exec("ls; cat a", timeout=10).stdout == b"a\nd\ngone-in-fork\n1\n"
            # Snapshots of forks stack.
            f2.exec("echo 3 > c", timeout=10)
            grandchild = overlay.fork(f2.snapshot())
            try:
                assert grandchild.exec("cat a c", timeout=10).stdout == b"1\n3\n"
            finally:
                grandchild.destroy()
            # The parent's reset drops its snapshot too: back to empty work.
            parent.reset_in_place()
            assert parent.exec("ls -A", timeout=10).stdout == b""
            assert f1.read_file("/sandbox/work/a") == b"1\n"
        finally:
            f1.destroy()
            f2.destroy()
        assert took_snapshot < 1.0
    finally:
        parent.destroy()
    with pytest.raises(SubstrateError):
        overlay.fork("no-such-snapshot")


# -- gc after a crash ------------------------------------------------------------------------------


def test_overlay_gc_after_simulated_crash(run_id, state_dir):
    require(OverlaySubstrate.missing())
    sub = OverlaySubstrate(run_id, state_dir)  # never closed: the "crashed" run
    boxes = [sub.create(), sub.create()]
    boxes[0].exec("(sleep 60 >/dev/null 2>&1 &)", timeout=10)
    boxes.append(sub.fork(boxes[1].snapshot()))
    holders = [b.holder_pid for b in boxes]
    folder = run_folder(state_dir, run_id)
    assert pids_with_env(RUN_VAR, run_id) and folder.exists()
    removed = OverlaySubstrate.gc(state_dir, {run_id})
    assert removed
    assert not pids_with_env(RUN_VAR, run_id)
    assert not any(alive(p) for p in holders)
    assert not host_mounts_below(folder)
    assert not folder.exists()
    assert not sub.leftovers()


def test_overlay_harness_killed_leaves_nothing(run_id, state_dir):
    """A harness that dies by SIGKILL takes its sandboxes' processes with it; gc then removes the
    folders and the disk bounds' tmpfs mounts."""
    require(OverlaySubstrate.missing())
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from drumsbench.substrates.overlay.sandbox import OverlaySubstrate
        sub = OverlaySubstrate({run_id!r}, Path({str(state_dir)!r}))
        boxes = [sub.create(), sub.create()]
        boxes[0].exec("(sleep 60 >/dev/null 2>&1 &)", timeout=10)
        print(" ".join(str(b.holder_pid) for b in boxes), flush=True)
        time.sleep(60)
        """
    )
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert harness.stdout is not None
        holders = [int(p) for p in harness.stdout.readline().split()]
        assert holders and all(alive(p) for p in holders)
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        pids_with_env(RUN_VAR, run_id) or any(map(alive, holders))
    ):
        time.sleep(0.05)
    assert not pids_with_env(RUN_VAR, run_id), "processes outlived the killed harness"
    assert not any(alive(p) for p in holders)
    folder = run_folder(state_dir, run_id)
    # the only host mounts: each sandbox's disk bound (a tmpfs on its folder), which gc removes
    assert sorted(host_mounts_below(folder)) == sorted(str(p) for p in (folder / "sb").iterdir())
    OverlaySubstrate.gc(state_dir, {run_id})
    assert not host_mounts_below(folder)
    assert not folder.exists()


def test_bwrap_gc_after_simulated_crash(run_id, state_dir):
    cls = registry.get("bwrap")
    require(cls.missing())
    sub = cls(run_id, state_dir)  # never closed
    boxes = [sub.create(), sub.create()]
    worker = threading.Thread(target=lambda: boxes[0].exec("sleep 60", timeout=60), daemon=True)
    worker.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not pids_with_env(RUN_VAR, run_id):
        time.sleep(0.02)
    assert pids_with_env(RUN_VAR, run_id)
    removed = cls.gc(state_dir, {run_id})
    assert removed
    worker.join(10)
    assert not worker.is_alive()
    assert not pids_with_env(RUN_VAR, run_id)
    assert not (state_dir / "bwrap" / run_id).exists()
    assert not sub.leftovers()
    assert not os.path.exists(boxes[1].host_root)
