"""Booted and live snapshots of the guest, and VMs made from them (boot, fork).

The booted snapshot is made once per machine and recipe; forks map its RAM copy-on-write (see
the package's docstring and docs/vm.md)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import SANDBOX_FOLDERS
from drumsbench.substrates.exec_core import SANDBOX_PATH
from drumsbench.substrates.vm.agent import AgentError
from drumsbench.substrates.vm.image import IMAGE_RECIPE, GuestImage, cache_lock, ensure_image
from drumsbench.substrates.vm.qemu import MEM_MIB, Qemu, choose_accel, machine_argv, qemu_img_overlay, qemu_version

SANDBOX_ROOT = "/sandbox"
BOOT_TIMEOUT_S = 240.0
FORK_TIMEOUT_S = 60.0
SNAP_RECIPE_VERSION = 1
# Run in the base VM before its snapshot, so every fork starts with these in its page cache.
WARM_UP = (
    "true",
    "python3 -c 'import json, hashlib, unittest, subprocess, base64, os, sys'",
    "git --version >/dev/null",
    "ps -eo args >/dev/null; grep -c x /dev/null; find /sandbox >/dev/null; ls >/dev/null",
)


def snapshot_key(image: GuestImage, accel: str) -> str:
    probe = machine_argv(image, accel, ram=Path("R"), share=True, disk=Path("D"), ctl_fd=0, qmp_fd=0,
                         console=Path("C"), name="N", pidfile=Path("P"), cache="X")
    recipe = {"image": image.key, "qemu": qemu_version(), "accel": accel, "mem": MEM_MIB, "argv": probe,
              "warm": WARM_UP, "version": SNAP_RECIPE_VERSION}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


# -- the booted snapshot ------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    folder: Path
    image: GuestImage
    accel: str
    accel_why: str
    boot_s: float

    @property
    def ram(self) -> Path:
        return self.folder / "ram"

    @property
    def state(self) -> Path:
        return self.folder / "state"

    @property
    def frozen(self) -> Path:
        return self.folder / "frozen.qcow2"

    @property
    def template(self) -> Path:
        return self.folder / "overlay.qcow2"


_snapshots: dict[str, Snapshot] = {}
_snapshots_lock = threading.Lock()


def boot(image: GuestImage, accel: str, folder: Path, run_id: str, sid: str, *, ram: Path, share: bool,
         disk: Path, timeout: float = BOOT_TIMEOUT_S, wrap: Any = None) -> Qemu:
    """Boot a fresh VM from the image; returns once its agent answers. ``wrap``: see ``Qemu``."""
    vm = Qemu(lambda c, q: machine_argv(image, accel, ram=ram, share=share, disk=disk, ctl_fd=c, qmp_fd=q,
                                        console=folder / "console.log", name=f"drumsbench-{run_id}-{sid}",
                                        pidfile=folder / "qemu.pid", cache="writeback"),
              folder, run_id, sid, timeout, wrap=wrap)
    try:
        vm.qmp.cmd("qmp_capabilities")
        vm.agent.call("ping", timeout)
    except (SubstrateError, AgentError) as e:
        why = vm.why_dead()
        vm.kill()
        raise SubstrateError(f"vm: boot failed ({e}); {why}") from e
    return vm


def ensure_snapshot(run_id: str, flavor: str = "base", image: GuestImage | None = None) -> Snapshot:
    """The booted snapshot of this machine's guest of rootfs ``flavor`` (or of guest ``image``: a
    task image's), built first if missing (one boot)."""
    image = image or ensure_image(flavor)
    accel, why = choose_accel(image)
    key = snapshot_key(image, accel)
    with _snapshots_lock:
        if key in _snapshots:
            return _snapshots[key]
    target = images.cache_dir() / f"vm-snap-{key}"
    with cache_lock("vm-snapshot"):
        if not (target / ".complete").exists():
            _prune_snapshots()
            _build_snapshot(image, accel, target, run_id)
        meta = json.loads((target / ".complete").read_text())
        with contextlib.suppress(OSError):
            (target / ".used").touch()
    snap = Snapshot(target, image, accel, why, float(meta.get("boot_s", 0.0)))
    with _snapshots_lock:
        _snapshots[key] = snap
    return snap


def _prune_snapshots(unused_for_s: float = 2 * 86400) -> None:
    """Remove booted snapshots of other recipes that no process has used for two days (about
    150 MB each); a snapshot in use is touched by every process that uses it."""
    for folder in images.cache_dir().glob("vm-snap-*"):
        stamp = folder / ".used" if (folder / ".used").exists() else folder / ".complete"
        with contextlib.suppress(OSError):
            if time.time() - stamp.stat().st_mtime > unused_for_s:
                shutil.rmtree(folder, ignore_errors=True)


def _build_snapshot(image: GuestImage, accel: str, target: Path, run_id: str) -> None:
    from drumsbench.substrates.vm.image import new_build_dir, publish

    tmp = new_build_dir("vm-snap")
    vm: Qemu | None = None
    try:
        ram, frozen = tmp / "ram", tmp / "frozen.qcow2"
        qemu_img_overlay(image.disk, frozen)
        t0 = time.monotonic()
        vm = boot(image, accel, tmp, run_id, "base", ram=ram, share=True, disk=frozen)
        boot_s = time.monotonic() - t0
        for d in SANDBOX_FOLDERS:
            vm.agent.call("exec", 60, argv=["mkdir", "-p", f"{SANDBOX_ROOT}/{d}"], cwd="/", env={"PATH": SANDBOX_PATH},
                          timeout=30, limit=4096)
        for cmd in WARM_UP:
            vm.agent.call("exec", 120, argv=["/bin/sh", "-c", cmd], cwd=SANDBOX_ROOT, env={"PATH": SANDBOX_PATH},
                          timeout=60, limit=4096)
        vm.agent.call("sync", 60)
        # The VM keeps running while its device state is saved; at completion QEMU stops it, so the
        # RAM file and the disk overlay are frozen at exactly the saved point.
        state = tmp / "state"
        vm.qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vm.qmp.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(state))}")
        vm.qmp.wait_migration()
        vm.kill()
        vm = None
        for p in (tmp / "qemu.pid", tmp / "qemu.log"):
            p.unlink(missing_ok=True)
        # The template every fork copies: an empty overlay on the frozen one at its published path.
        qemu_img_overlay(target / "frozen.qcow2", tmp / "overlay.qcow2", size=str(IMAGE_RECIPE["disk_size"]))
        for p in (ram, state, frozen, tmp / "overlay.qcow2"):
            os.chmod(p, 0o444)
        publish(tmp, target, {"boot_s": boot_s, "accel": accel, "image": image.key, "qemu": qemu_version(),
                              "mem_mib": MEM_MIB, "made": time.time()})
    except BaseException:
        if vm is not None:
            vm.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fork(snap: Snapshot, folder: Path, run_id: str, sid: str, timeout: float = FORK_TIMEOUT_S,
         wrap: Any = None) -> Qemu:
    """A new VM running from a snapshot (the booted one or a live one), with its own overlay on the
    frozen disk, its own copy-on-write view of the RAM file, a corrected clock and fresh entropy."""
    disk = folder / "disk.qcow2"
    shutil.copyfile(snap.template, disk)
    state_fd = os.open(snap.state, os.O_RDONLY)
    try:
        vm = Qemu(lambda c, q: [*machine_argv(snap.image, snap.accel, ram=snap.ram, share=False, disk=disk,
                                              ctl_fd=c, qmp_fd=q, console=folder / "console.log",
                                              name=f"drumsbench-{run_id}-{sid}", pidfile=folder / "qemu.pid",
                                              cache="unsafe"),
                                 "-incoming", "defer"],
                  folder, run_id, sid, timeout, extra_fds=(state_fd,), wrap=wrap)
    finally:
        os.close(state_fd)
    try:
        vm.qmp.send("qmp_capabilities")
        vm.qmp.send("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vm.qmp.send("migrate-incoming", uri=f"fd:{state_fd}")
        for _ in range(3):
            vm.qmp.answer()
        vm.agent.call("hello", timeout, time=time.time(), seed=base64.b64encode(os.urandom(64)).decode())
    except (SubstrateError, AgentError, OSError, ValueError) as e:
        why = vm.why_dead()
        vm.kill()
        raise SubstrateError(f"vm: fork failed ({e}); {why}") from e
    return vm


def live_snapshot(vm: Qemu, base: Snapshot, folder: Path, run_id: str, snap_id: str) -> Snapshot:
    """Freeze a running VM's RAM, devices and disk into ``folder`` as a shared-RAM snapshot; the VM
    runs on. Forks of it start in 0.3 s like forks of the booted snapshot.

    1. ``stop`` the VM; ``blockdev-snapshot-sync`` moves its writes to a new overlay, so its disk
       as of now is frozen (hard-linked into ``folder``);
    2. a **loader** QEMU, paused for good, maps a new RAM file shared and receives the VM's full
       state over a unix socket (the VM's own RAM is a private mapping: all of it is sent);
    3. the VM continues (``cont``); the loader saves only its device state (``x-ignore-shared``)
       and exits. It was started with ``store-global-state=off`` so that forks of this state run
       instead of inheriting the loader's paused state.
    """
    loader_dir = folder / "loader"
    loader_dir.mkdir()
    to_loader, in_loader = socket.socketpair()  # the migration stream: no socket file, no path limit
    q = vm.qmp
    loader: Qemu | None = None
    try:
        q.cmd("stop")
        try:
            new_top = vm.folder / f"disk-{snap_id}.qcow2"
            q.cmd("blockdev-snapshot-sync", device="d0", format="qcow2", mode="absolute-paths",
                  **{"snapshot-file": str(new_top)})
            os.link(vm.disk, folder / "frozen.qcow2")
            vm.disk = new_top
            in_loader_fd = in_loader.fileno()
            scratch = loader_dir / "disk.qcow2"
            qemu_img_overlay(folder / "frozen.qcow2", scratch)
            loader = Qemu(lambda c, m: [*machine_argv(base.image, base.accel, ram=folder / "ram", share=True,
                                                      disk=scratch, ctl_fd=c, qmp_fd=m,
                                                      console=loader_dir / "console.log",
                                                      name=f"drumsbench-{run_id}-snap-{snap_id}",
                                                      pidfile=loader_dir / "qemu.pid", cache="unsafe"),
                                        "-incoming", "defer", "-global", "migration.store-global-state=off"],
                          loader_dir, run_id, f"snap-{snap_id}", FORK_TIMEOUT_S, extra_fds=(in_loader.fileno(),))
            in_loader.close()
            loader.qmp.cmd("qmp_capabilities")
            loader.qmp.cmd("migrate-incoming", uri=f"fd:{in_loader_fd}")
            q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}])
            q.send_fd("snapshot", to_loader.fileno())
            q.cmd("migrate", uri="fd:snapshot")
            q.wait_migration()
            loader.qmp.wait_migration()
        finally:
            q.cmd("cont")
        loader.qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        loader.qmp.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(folder / 'state'))}")
        loader.qmp.wait_migration()
    except (SubstrateError, OSError, ValueError) as e:
        why = loader.why_dead() if loader is not None else ""
        raise SubstrateError(f"vm: live snapshot failed ({e}) {why}".strip()) from e
    finally:
        if loader is not None:
            loader.kill()
        shutil.rmtree(loader_dir, ignore_errors=True)
        to_loader.close()
        in_loader.close()
    qemu_img_overlay(folder / "frozen.qcow2", folder / "overlay.qcow2", size=str(IMAGE_RECIPE["disk_size"]))
    return Snapshot(folder, base.image, base.accel, base.accel_why, 0.0)


def fresh_disk(image: GuestImage, folder: Path) -> Path:
    disk = folder / "disk.qcow2"
    disk.unlink(missing_ok=True)
    qemu_img_overlay(image.disk, disk)
    return disk
