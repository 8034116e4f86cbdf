"""The ``vm`` substrate beyond the conformance suite: forks from the booted snapshot are independent
(files, random bytes), get a corrected clock, have no network, and leave nothing behind after
destroy or ``gc``. Kept short: every VM here is a fork of the one cached booted snapshot."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates import registry
from drumsbench.substrates.hostproc import pids_with_env
from drumsbench.substrates.vm.image import is_static, module_order, newc
from drumsbench.substrates.vm.qemu import RUN_VAR
from drumsbench.substrates.vm.sandbox import VmSubstrate

from conftest import require


@pytest.fixture
def vm(run_id: str, state_dir: Path):
    require(VmSubstrate.missing())
    sub = VmSubstrate(run_id, state_dir)
    try:
        yield sub
    finally:
        sub.close()
        assert not sub.leftovers()


def _random_bytes(box) -> bytes:
    res = box.exec("head -c 16 /dev/urandom | od -An -tx1", timeout=30)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def test_registered():
    assert registry.get("vm") is VmSubstrate


def test_forks_are_independent(vm):
    boxes = [vm.create() for _ in range(3)]
    try:
        rand = [_random_bytes(b) for b in boxes]
        assert len(set(rand)) == 3, f"forks read the same random bytes: {rand}"
        py = [b.exec(["python3", "-c", "import os; print(os.urandom(8).hex())"], timeout=60).stdout for b in boxes]
        assert len(set(py)) == 3, f"forks' os.urandom agree: {py}"
        boxes[0].write_file("/root/written-in-fork-0", b"mine")
        boxes[0].exec("echo also > /sandbox/work/made-by-fork-0", timeout=30)
        for b in boxes[1:]:
            res = b.exec("ls /root /sandbox/work", timeout=30)
            assert b"fork-0" not in res.stdout, "a file written in one fork appears in another"
        assert boxes[0].read_file("/root/written-in-fork-0") == b"mine"
        # each fork has its own disk overlay on top of the frozen one, and its own QEMU
        assert len({b.vm.proc.pid for b in boxes}) == 3
    finally:
        for b in boxes:
            b.destroy()


def test_fork_clock_and_machine(vm):
    box = vm.create()
    try:
        when = int(box.exec("date +%s", timeout=30).stdout)
        assert abs(when - time.time()) < 10, "the guest clock was not corrected after the fork"
        nets = box.exec("ls /sys/class/net", timeout=30).stdout.split()
        assert nets == [b"lo"], f"the guest must have no network device: {nets}"
        assert box.exec("hostname", timeout=30).stdout.strip() == b"sandbox"
        assert vm.accel in ("tcg", "kvm")
        assert f"accel={vm.accel}" in vm.capabilities.notes
    finally:
        box.destroy()


def test_timeout_kills_processes_that_left_the_session(vm):
    box = vm.create()
    try:
        res = box.exec("setsid sleep 61.5 & sleep 60", timeout=0.5)
        assert res.timed_out
        left = box.exec("ps -eo args | grep -c '^sleep 61.5' || true", timeout=30).stdout.strip()
        assert left == b"0", "a process that left the command's session survived its timeout"
    finally:
        box.destroy()


def test_in_place_reset_keeps_the_vm(vm):
    box = vm.create()
    try:
        pid = box.vm.proc.pid
        box.write_file(f"{box.paths.tmp}/x", b"1")
        box.exec("(setsid sleep 62.5 > /dev/null 2>&1 &); echo dirt > /tmp/dirt", timeout=30)
        # 40 MiB written and removed by the reset: discarded down to the host's overlay file too
        assert box.exec("head -c 41943040 /dev/urandom > /sandbox/work/big && sync", timeout=120).exit_code == 0
        written = os.stat(box.vm.disk).st_blocks * 512
        box.reset_in_place()
        assert box.vm.proc.pid == pid
        res = box.exec("ls -A /sandbox/tmp /tmp; ps -eo args | grep -c '^sleep 62.5' || true", timeout=30)
        assert res.stdout.split() == [b"/sandbox/tmp:", b"/tmp:", b"0"], res.stdout
        left = os.stat(box.vm.disk).st_blocks * 512
        assert written >= 40 << 20 and left < written - (30 << 20), (written, left)
    finally:
        box.destroy()


def test_vm_dying_is_a_substrate_error(vm):
    box = vm.create()
    try:
        os.kill(box.vm.proc.pid, signal.SIGKILL)
        with pytest.raises(SubstrateError):
            box.exec("true", timeout=5)
    finally:
        box.destroy()


def test_gc_removes_what_a_crashed_run_left(vm, run_id, state_dir):
    boxes = [vm.create() for _ in range(2)]
    pids = {b.vm.proc.pid for b in boxes}
    assert set(pids_with_env(RUN_VAR, run_id)) == pids
    # two QEMU processes, two sandbox folders, and where the host has them two cgroups (QEMU's bounds)
    assert len(vm.leftovers()) == (6 if vm.cgroups else 4), vm.leftovers()
    removed = VmSubstrate.gc(state_dir, {run_id})  # as `drumsbench gc` would after a crash
    assert removed
    for b in boxes:
        b.vm.proc.wait(timeout=10)
    assert not pids_with_env(RUN_VAR, run_id)
    assert not vm.leftovers()
    leftover_files = [p for p in state_dir.rglob("*") if p.suffix in (".qcow2", ".sock", ".pid")]
    assert not leftover_files
    for b in boxes:
        b.destroy()  # idempotent after gc


# -- image recipe helpers (no VM) -----------------------------------------------------------------
def test_module_order_puts_dependencies_first(tmp_path):
    def ko(name: str, depends: str) -> Path:
        p = tmp_path / f"{name}.ko"
        p.write_bytes(b"\x7fELF...\0name=" + name.encode() + b"\0depends=" + depends.encode() + b"\0vermagic=x\0")
        return p

    mods = {"ext4": ko("ext4", "mbcache,jbd2,crc16"), "jbd2": ko("jbd2", ""), "mbcache": ko("mbcache", ""),
            "crc16": ko("crc16", ""), "virtio_blk": ko("virtio_blk", "virtio,virtio_ring"),
            "virtio": ko("virtio", ""), "virtio_ring": ko("virtio_ring", "")}
    order = module_order(mods, ("virtio_blk", "ext4"))
    for mod, deps in (("ext4", ("mbcache", "jbd2", "crc16")), ("virtio_blk", ("virtio", "virtio_ring"))):
        assert all(order.index(d) < order.index(mod) for d in deps)
    with pytest.raises(SubstrateError, match="not found"):
        module_order(mods, ("nope",))


def test_newc_archive_layout():
    data = newc([("init", 0o100755, b"#!/bin/sh\n"), ("bin/sh", 0o120777, b"busybox")])
    assert data.startswith(b"070701") and b"TRAILER!!!" in data
    assert len(data) % 4 == 0


def test_is_static(tmp_path):
    assert not is_static(Path("/bin/sh"))
    (tmp_path / "x").write_bytes(b"not an elf")
    assert not is_static(tmp_path / "x")


def test_live_snapshot_forks_carry_running_processes(vm):
    """The branch experiment's `snapshot` method: a live VM frozen once, continuations forked from it."""
    parent = vm.create()
    try:
        parent.exec("echo prepared > /sandbox/work/state.txt; (setsid sleep 63.5 > /dev/null 2>&1 &)", timeout=30)
        snap = parent.snapshot()
        parent.exec("echo later > /sandbox/work/after.txt", timeout=30)  # the parent runs on
        kids = [vm.fork(snap) for _ in range(2)]
        try:
            for k in kids:
                res = k.exec("cat /sandbox/work/state.txt; ls /sandbox/work; ps -eo args | grep -c '^sleep 63.5'",
                             timeout=30)
                assert res.stdout.split() == [b"prepared", b"state.txt", b"1"], res.stdout
            assert len({_random_bytes(k) for k in kids}) == 2
            kids[0].write_file("/sandbox/work/only-0", b"x")
            assert b"only-0" not in kids[1].exec("ls /sandbox/work", timeout=30).stdout
        finally:
            for k in kids:
                k.destroy()
        vm.drop_snapshot(snap)
        with pytest.raises(SubstrateError):
            vm.fork(snap)
    finally:
        parent.destroy()
