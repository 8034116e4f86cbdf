"""The ``vm`` substrate's guest: Debian kernel, a small initramfs, and a qcow2 disk of the shared rootfs.

Everything is cached under ``images.cache_dir()`` and only ever published complete (built in a
temporary folder, then renamed):

- ``vm-kernel-<package version>/``: ``vmlinuz`` and the few modules the guest needs, taken from
  Debian's ``linux-image-<abi>-amd64`` package (``apt-get download``, extracted with ``dpkg-deb``;
  nothing is installed on the host). Debian's kernel has virtio, virtio_blk, virtio_console and
  ext4 as modules, so a small initramfs loads them in dependency order (read from each module's
  ``.modinfo``; the package ships no ``modules.dep``).
- ``vm-disk-<hash>/base.qcow2``: ``mkfs.ext4 -d`` of ``images.ensure_rootfs(flavor)`` then ``qemu-img
  convert``; the hash covers the rootfs recipe and ``IMAGE_RECIPE``. One disk per rootfs flavor
  (``images.FLAVORS``): ``base``, and ``desktop`` (Xvfb, openbox, LibreOffice, python3-uno added)
  for the desktop environment; both boot the same kernel and initramfs.
- ``vm-boot-<hash>/``: ``vmlinuz`` and ``initrd.img`` (busybox-static, those modules, ``/init`` and
  the guest agent, ``agent.c`` compiled static with the host's gcc); the hash covers the
  kernel version, the init script, the agent's source and its compiler flags.

``python -m drumsbench.substrates.vm.image [FLAVOR ...]`` builds the images and booted snapshots of
those flavors ahead of time (default: every flavor; ``scripts/setup-vm.sh`` calls it).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from drumsbench import images
from drumsbench.core.errors import SubstrateError

IMAGE_RECIPE: dict[str, object] = {"disk_size": "2G", "fs": "ext4", "version": 1}
# Modules the guest needs, beyond what Debian builds in; their dependencies are added.
WANT_MODULES = ("crc32c_generic", "virtio_pci", "virtio_blk", "virtio_console", "ext4")
BUSYBOX_APPLETS = ("sh", "mount", "insmod", "switch_root", "mkdir", "cat", "cp", "echo", "grep",
                   "poweroff", "sleep", "ls")
AGENT_SOURCE = Path(__file__).with_name("agent.c")
AGENT_CFLAGS = ("-static", "-O2", "-pthread", "-s", "-Wall")
PROBE_MARK = "DRUMSBENCH-PROBE-OK"

INIT_SCRIPT = """#!/bin/sh
# initramfs init of the drumsbench vm guest: load modules, mount the root disk, become the agent.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
if grep -q drumsbench.probe /proc/cmdline; then
  echo "{probe}" > /dev/ttyS0
  poweroff -f
fi
for m in $(cat /modules.order); do insmod /modules/$m.ko || echo "insmod $m failed"; done
i=0
while [ ! -b /dev/vda ]; do
  sleep 0.02; i=$((i+1))
  if [ $i -gt 1000 ]; then echo "drumsbench init: no /dev/vda"; poweroff -f; fi
done
mkdir -p /newroot
mount -t ext4 -o rw,noatime /dev/vda /newroot || { echo "drumsbench init: mount failed"; poweroff -f; }
mount -t tmpfs -o mode=0755,size=16m tmpfs /newroot/run
mkdir -p /newroot/run/drumsbench
cp /agent /newroot/run/drumsbench/agent
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /run/drumsbench/agent ctl
""".replace("{probe}", PROBE_MARK)

_build_lock = threading.Lock()


@dataclass(frozen=True)
class GuestImage:
    folder: Path
    kernel: Path
    initrd: Path
    disk: Path  # base.qcow2: never written to, only used as a backing file
    key: str
    kernel_version: str
    flavor: str = "base"  # the rootfs flavor the disk holds (``images.FLAVORS``)


# -- helpers ------------------------------------------------------------------------------------
def run(cmd: list[str], what: str, cwd: Path | None = None, timeout: float = 600) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SubstrateError(f"vm image: {what}: {e}") from e
    if proc.returncode != 0:
        raise SubstrateError(f"vm image: {what} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc.stdout


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One builder at a time, across threads and processes."""
    folder = images.cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock, open(folder / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def publish(tmp: Path, target: Path, meta: dict[str, object]) -> None:
    (tmp / ".complete").write_text(json.dumps(meta, sort_keys=True))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


def new_build_dir(prefix: str) -> Path:
    base = images.cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    for stale in base.glob(f".{prefix}-build-*"):  # left by a crashed build (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{prefix}-build-", dir=base))


# -- kernel -------------------------------------------------------------------------------------
def kernel_package() -> str | None:
    """The package ``linux-image-amd64`` depends on now (e.g. linux-image-6.1.0-57-amd64)."""
    try:
        out = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Depends:\s*(linux-image-\d\S*)", out)
    return m.group(1) if m else None


def module_info(ko: Path) -> dict[str, str]:
    """``key=value`` strings of a module's ``.modinfo`` section (read from the raw bytes)."""
    info: dict[str, str] = {}
    for m in re.finditer(rb"(depends|name|softdep)=([^\0]*)\0", ko.read_bytes()):
        info.setdefault(m.group(1).decode(), m.group(2).decode())
    return info


def module_order(modules: dict[str, Path], want: tuple[str, ...]) -> list[str]:
    """``want`` and their dependencies, each after what it depends on."""
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in trail:
            raise SubstrateError(f"vm image: module dependency cycle {' -> '.join((*trail, name))}")
        if name not in modules:
            raise SubstrateError(f"vm image: kernel module {name} not found in the kernel package")
        for dep in filter(None, module_info(modules[name]).get("depends", "").split(",")):
            visit(dep, (*trail, name))
        order.append(name)

    for w in want:
        visit(w, ())
    return order


def ensure_kernel() -> tuple[Path, str]:
    """(folder with ``vmlinuz`` and ``modules/``, kernel version) from Debian's kernel package.

    The first kernel fetched is kept (pinned: every figure is measured with the same guest
    kernel, and apt is not asked at every start); ``DRUMSBENCH_VM_KERNEL_REFRESH=1`` fetches the
    one ``linux-image-amd64`` depends on now.
    """
    base = images.cache_dir()
    cached = sorted(base.glob("vm-kernel-*/.complete"), key=lambda p: p.stat().st_mtime)
    if cached and os.environ.get("DRUMSBENCH_VM_KERNEL_REFRESH") != "1":
        return cached[-1].parent, json.loads(cached[-1].read_text())["version"]
    pkg = kernel_package()
    if pkg is None:
        raise SubstrateError("vm image: cannot tell Debian's kernel package (apt-cache depends "
                             "linux-image-amd64 failed; run apt-get update)")
    target = base / f"vm-kernel-{pkg.removeprefix('linux-image-')}"
    if (target / ".complete").exists():
        (target / ".complete").touch()
        return target, json.loads((target / ".complete").read_text())["version"]
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SubstrateError("vm image: apt-get and dpkg-deb are needed to fetch Debian's kernel")
    tmp = new_build_dir("vm-kernel")
    try:
        run(["apt-get", "download", "-q", pkg], f"apt-get download {pkg}", cwd=tmp)
        debs = list(tmp.glob("*.deb"))
        if not debs:
            raise SubstrateError(f"vm image: apt-get download {pkg} gave no .deb")
        x = tmp / "x"
        run(["dpkg-deb", "-x", str(debs[0]), str(x)], "dpkg-deb -x")
        vmlinuz = sorted((x / "boot").glob("vmlinuz-*"))
        mod_roots = sorted((x / "lib" / "modules").glob("*"))
        if not vmlinuz or not mod_roots:
            raise SubstrateError(f"vm image: {debs[0].name} holds no vmlinuz or modules")
        version = mod_roots[0].name
        modules = {p.name.removesuffix(".ko").replace("-", "_"): p for p in mod_roots[0].rglob("*.ko")}
        order = module_order(modules, WANT_MODULES)
        out = tmp / "out"
        (out / "modules").mkdir(parents=True)
        shutil.copy(vmlinuz[0], out / "vmlinuz")
        for name in order:
            shutil.copy(modules[name], out / "modules" / f"{name}.ko")
        (out / "modules.order").write_text("\n".join(order) + "\n")
        publish(out, target, {"package": pkg, "version": version, "deb": debs[0].name})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, version


# -- initramfs ----------------------------------------------------------------------------------
def newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio 'newc' archive of (path, mode, data) entries; symlinks carry their target as data."""
    buf = io.BytesIO()

    def add(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\0"
        hdr = (
            b"070701" + b"".join(f"{v:08X}".encode() for v in (
                ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        )
        buf.write(hdr + nb)
        buf.write(b"\0" * (-(len(hdr) + len(nb)) % 4))
        buf.write(data)
        buf.write(b"\0" * (-len(data) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        add(name, mode, data, ino)
    add("TRAILER!!!", 0, b"", 0)
    return buf.getvalue()


def busybox_path() -> Path:
    for p in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(p).exists():
            return Path(p)
    raise SubstrateError("busybox is missing: apt-get install busybox-static (or scripts/setup-vm.sh)")


def is_static(binary: Path) -> bool:
    """True when the ELF file has no PT_INTERP (no dynamic loader)."""
    import struct

    with open(binary, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def build_agent(out: Path) -> bytes:
    """Compile the guest agent (static, so it needs nothing from the guest's libraries)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SubstrateError("vm image: gcc is missing to build the guest agent: apt-get install gcc libc6-dev")
    run([cc, *AGENT_CFLAGS, "-o", str(out), str(AGENT_SOURCE)], "compiling the guest agent (gcc -static)")
    return out.read_bytes()


def build_initrd(kernel_dir: Path, agent: bytes) -> bytes:
    bb = busybox_path()
    if not is_static(bb):
        raise SubstrateError(f"{bb} is not static: apt-get install busybox-static")
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o040755, b""), ("dev", 0o040755, b""), ("proc", 0o040755, b""), ("sys", 0o040755, b""),
        ("modules", 0o040755, b""), ("newroot", 0o040755, b""),
        ("bin/busybox", 0o100755, bb.read_bytes()),
    ]
    entries += [(f"bin/{a}", 0o120777, b"busybox") for a in BUSYBOX_APPLETS]
    order = (kernel_dir / "modules.order").read_text().split()
    entries += [(f"modules/{m}.ko", 0o100644, (kernel_dir / "modules" / f"{m}.ko").read_bytes()) for m in order]
    entries += [
        ("modules.order", 0o100644, "\n".join(order).encode() + b"\n"),
        ("init", 0o100755, INIT_SCRIPT.encode()),
        ("agent", 0o100755, agent),
    ]
    return gzip.compress(newc(entries), compresslevel=6, mtime=0)


# -- image ------------------------------------------------------------------------------------
def _key(recipe: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def disk_key(rootfs_hash: str) -> str:
    return _key({"image": IMAGE_RECIPE, "rootfs": rootfs_hash})


def boot_key(kernel_version: str) -> str:
    return _key({"kernel": kernel_version, "init": INIT_SCRIPT, "modules": WANT_MODULES, "cflags": AGENT_CFLAGS,
                 "agent": hashlib.sha256(AGENT_SOURCE.read_bytes()).hexdigest()})


def missing_tools() -> str | None:
    for tool, pkg in (("qemu-system-x86_64", "qemu-system-x86"), ("qemu-img", "qemu-utils"),
                      ("mkfs.ext4", "e2fsprogs"), ("debootstrap", "debootstrap"), ("gcc", "gcc libc6-dev")):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install {pkg} (or run scripts/setup-vm.sh)"
    try:
        bb = busybox_path()
    except SubstrateError as e:
        return str(e)
    if not is_static(bb):
        return f"{bb} is not static: apt-get install busybox-static (or run scripts/setup-vm.sh)"
    return None


def ensure_disk(flavor: str = "base") -> Path:
    """``vm-disk-<hash>/base.qcow2``: the shared rootfs of ``flavor`` as an ext4 disk (a read-only
    backing file). The desktop's rootfs (about 1.1 GB) fits the same 2 GB disk with room to write."""
    rootfs = images.ensure_rootfs(flavor)
    return disk_of(rootfs, disk_key(images.recipe_hash(flavor)), {"rootfs": str(rootfs), "flavor": flavor})


def disk_of(root: Path, key: str, meta: dict[str, object]) -> Path:
    """``vm-disk-<key>/base.qcow2``: folder ``root`` as an ext4 disk of ``IMAGE_RECIPE``'s size
    (``mkfs.ext4 -d``: owners, modes and links kept), made once per key."""
    target = images.cache_dir() / f"vm-disk-{key}"
    if not (target / ".complete").exists():
        tmp = new_build_dir("vm-disk")
        try:
            raw = tmp / "root.raw"
            run(["mkfs.ext4", "-q", "-F", "-L", "drumsbench", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                 "-d", str(root), str(raw), str(IMAGE_RECIPE["disk_size"])], "mkfs.ext4 -d")
            run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(tmp / "base.qcow2")], "qemu-img convert")
            raw.unlink()
            os.chmod(tmp / "base.qcow2", 0o444)
            publish(tmp, target, {**meta, "recipe": IMAGE_RECIPE})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target / "base.qcow2"


_images: dict[str, GuestImage] = {}


def ensure_image(flavor: str = "base") -> GuestImage:
    """The cached guest of rootfs ``flavor`` (kernel, initramfs, disk), built first if missing;
    looked up once per process and flavor.

    About 20 s the first time (kernel download, mkfs), plus the rootfs if that is missing too.
    """
    known = _images.get(flavor)
    if known is not None and (known.folder / ".complete").exists() and known.disk.exists():
        return known
    with cache_lock("vm-image"):
        image = guest_of(ensure_disk(flavor), flavor)
    _images[flavor] = image
    return image


def guest_of(disk: Path, flavor: str) -> GuestImage:
    """The guest that boots ``disk`` with this machine's kernel and initramfs (built first if
    missing; call under ``cache_lock("vm-image")``)."""
    kernel_dir, kver = ensure_kernel()
    key = boot_key(kver)
    target = images.cache_dir() / f"vm-boot-{key}"
    if not (target / ".complete").exists():
        tmp = new_build_dir("vm-boot")
        try:
            agent = build_agent(tmp / "agent")
            (tmp / "initrd.img").write_bytes(build_initrd(kernel_dir, agent))
            shutil.copy(kernel_dir / "vmlinuz", tmp / "vmlinuz")
            publish(tmp, target, {"kernel": kver, "key": key})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    full_key = _key({"boot": key, "disk": disk.parent.name})
    return GuestImage(target, target / "vmlinuz", target / "initrd.img", disk, full_key, kver, flavor)


def ensure_task_image(image: str, layers: tuple[str, ...], skeleton: Path) -> GuestImage:
    """The guest of a task image (``RecipeImages``): its disk is the image's file system — the
    ``skeleton`` folder (``sandbox/{work,home,tmp,verify}``) over the image's layer folders, top first,
    as a read-only overlay mounted for ``mkfs`` and detached after — made once per image and layers
    (``image``: the engine's reference, e.g. ``docker:drumsbench-task:<recipe hash>``)."""
    key = _key({"image": IMAGE_RECIPE, "task_image": image, "layers": list(layers)})
    flavor = f"task-{key}"
    known = _images.get(flavor)
    if known is not None and (known.folder / ".complete").exists() and known.disk.exists():
        return known
    with cache_lock("vm-image"):
        # a build killed while its layers were mounted left the mount: no build runs now (the lock)
        for stale in images.cache_dir().glob(".vm-root-build-*"):
            subprocess.run(["umount", "-l", str(stale)], capture_output=True, timeout=60)
            with contextlib.suppress(OSError):
                stale.rmdir()  # (the empty mount point; never anything below it)
        if not (images.cache_dir() / f"vm-disk-{key}" / ".complete").exists():
            _prune_task_disks()
            with _layers_mounted((str(skeleton), *layers)) as root:
                disk = disk_of(root, key, {"task_image": image})
        else:
            disk = images.cache_dir() / f"vm-disk-{key}" / "base.qcow2"
        with contextlib.suppress(OSError):
            (disk.parent / ".used").touch()
        guest = guest_of(disk, flavor)
    _images[flavor] = guest
    return guest


def _prune_task_disks(unused_for_s: float = 2 * 86400) -> None:
    """Remove task images' disks (400-600 MB each) that no process has used for two days (their
    booted snapshots go the same way: ``snapshot._prune_snapshots``)."""
    for folder in images.cache_dir().glob("vm-disk-*"):
        with contextlib.suppress(OSError, ValueError):
            if "task_image" not in json.loads((folder / ".complete").read_text()):
                continue
            stamp = folder / ".used" if (folder / ".used").exists() else folder / ".complete"
            if time.time() - stamp.stat().st_mtime > unused_for_s:
                shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _layers_mounted(lower: tuple[str, ...]) -> Iterator[Path]:
    """A read-only overlay of ``lower`` (top first) on a fresh folder of the cache, detached after."""
    from drumsbench.substrates.layer_mounts import mountable

    where = new_build_dir("vm-root")
    opts = "lowerdir=" + ":".join(mountable(p, "vm") for p in lower)
    try:
        run(["mount", "-t", "overlay", "overlay", "-o", f"ro,{opts}", str(where)], "mount the image's layers")
        try:
            yield where
        finally:
            subprocess.run(["umount", str(where)], capture_output=True, timeout=60)
    finally:
        with contextlib.suppress(OSError):
            where.rmdir()


if __name__ == "__main__":
    import sys
    import uuid

    from drumsbench.substrates.vm.snapshot import ensure_snapshot

    for flavor in sys.argv[1:] or images.FLAVORS:
        img = ensure_image(flavor)
        print(f"vm image ({flavor}): {img.folder}, disk {img.disk.parent.name} (kernel {img.kernel_version})")
        snap = ensure_snapshot(f"setup-{uuid.uuid4().hex[:8]}", flavor)
        print(f"vm snapshot ({flavor}): {snap.folder} (accel {snap.accel}, boot {snap.boot_s:.1f} s)")
    sys.exit(0)
