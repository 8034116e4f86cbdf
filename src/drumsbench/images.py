"""The Debian root filesystem that container-like substrates run in, built from Debian's packages.

Contract: ``ensure_rootfs()`` returns a folder holding a complete root filesystem built by
``debootstrap --variant=minbase`` from the mirror this host's apt already uses, for the suite of
this host. It is cached under ``cache_dir()/rootfs-<recipe hash>``; a folder is only ever
published complete (built in a temporary folder, then renamed), so a crash mid-build leaves
nothing that looks usable. A change of ``RECIPE`` changes the hash and so rebuilds.
``ensure_rootfs_tar()`` returns a tarball of it (for ``docker import`` / ``podman import``).

Flavors: ``base`` (the coding sandboxes) and ``desktop`` (``base`` plus the desktop environment's
system parts: Xvfb, openbox, xdotool, LibreOffice Writer and Calc, python3-uno and the fonts of
the built-in documents, the packages ``scripts/setup-desktop.sh`` puts on the host). Each flavor
has its own recipe hash and cache folder. ``desktop`` is ``base`` copied, with its packages added by
apt in a chroot; apt takes the packages the host's apt already holds (/var/cache/apt/archives,
hard-linked) instead of downloading them again, and checks them either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from drumsbench import office_lockdown
from drumsbench.core.errors import SubstrateError

INCLUDE = ["python3", "git", "procps", "ca-certificates"]
RECIPE: dict[str, object] = {
    "variant": "minbase",
    "include": INCLUDE,
    "version": 1,
}
# what the desktop environment runs inside a container (as on the host: scripts/setup-desktop.sh)
DESKTOP_INCLUDE = ["xvfb", "openbox", "xdotool", "libreoffice-writer", "libreoffice-calc", "python3-uno",
                   "fonts-liberation", "fonts-dejavu-core"]
FLAVORS = ("base", "desktop")
HOST_DEBS = Path("/var/cache/apt/archives")


def recipe(flavor: str = "base") -> dict[str, object]:
    """The recipe of ``flavor`` (``FLAVORS``); ``base`` is ``RECIPE`` unchanged (its hash, and so
    every cached rootfs and image tag, stays what it was)."""
    if flavor == "base":
        return dict(RECIPE)
    if flavor == "desktop":
        # the lock's text is part of the recipe: a changed lock is a new rootfs, and new images
        lock = hashlib.sha256(office_lockdown.xcd_text().encode()).hexdigest()[:12]
        return dict(RECIPE, include=INCLUDE + DESKTOP_INCLUDE, flavor="desktop", office_lockdown=lock)
    raise SubstrateError(f"unknown rootfs flavor {flavor!r} (one of {', '.join(FLAVORS)})")


def cache_dir() -> Path:
    base = os.environ.get("DRUMSBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "drumsbench"
    )
    return Path(base)


def host_suite() -> str:
    """The Debian suite of this host (bookworm, trixie, ...), from /etc/os-release."""
    text = Path("/etc/os-release").read_text()
    m = re.search(r"^VERSION_CODENAME=(\S+)$", text, re.M)
    if not m:
        raise SubstrateError("cannot tell the Debian suite from /etc/os-release (VERSION_CODENAME)")
    return m.group(1).strip('"')


def host_mirror() -> str:
    """The Debian mirror this host's apt uses (read from apt's sources, never hard-coded)."""
    candidates: list[str] = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = path.read_text()
        except OSError:
            continue
        candidates += re.findall(r"^URIs:\s*(\S+)", text, re.M)
        candidates += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri
    raise SubstrateError("no Debian mirror found in /etc/apt/sources.list*; the rootfs needs one")


def recipe_hash(flavor: str = "base") -> str:
    full = dict(recipe(flavor), suite=host_suite())
    return hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:12]


def rootfs_tag(flavor: str = "base") -> str:
    """Image tag for container engines: changes whenever the recipe does."""
    name = "drumsbench-rootfs" if flavor == "base" else f"drumsbench-rootfs-{flavor}"
    return f"{name}:{recipe_hash(flavor)}"


def rootfs_dir(flavor: str = "base") -> Path:
    """Where the rootfs of ``flavor`` is cached (complete once it holds ``.drumsbench-complete``)."""
    return cache_dir() / f"rootfs-{recipe_hash(flavor)}"


# run in the copy of the base rootfs (chroot, /proc mounted in a mount namespace of its own): apt
# takes the host apt's packages from the linked folder and downloads only what is not there
APT_INSTALL = (
    "apt-get -qq -o Dir::Cache::Archives={debs} update && "
    "apt-get -qq -y -o Dir::Cache::Archives={debs} install --no-install-recommends {pkgs}"
)
TRIM = ("var/lib/apt/lists", "var/cache/apt/archives", "usr/share/doc", "usr/share/man", "usr/share/info")


def _link_host_debs(dest: Path) -> None:
    """Hard links to the host apt's packages in ``dest`` (copies are not made: what cannot be
    linked, apt downloads)."""
    dest.mkdir(parents=True, exist_ok=True)
    for deb in HOST_DEBS.glob("*.deb"):
        try:
            os.link(deb, dest / deb.name)
        except FileExistsError:
            continue
        except OSError:  # another file system: apt downloads what it needs
            return


def _trim(root: Path, docs: bool) -> None:
    """Remove what no sandbox needs: the files of apt's lists and caches and, with ``docs``, the
    documentation (``base`` keeps it: its recipe, and so its hash, predates the trim)."""
    for junk in TRIM if docs else TRIM[:2]:
        for p in (root / junk).glob("*"):
            if p.is_dir() and not p.is_symlink():
                if docs:
                    shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _add_packages(root: Path, packages: list[str]) -> None:
    """Install ``packages`` (and their dependencies, no recommends) into the rootfs at ``root``:
    apt-get in a chroot, /proc mounted in a private mount namespace (gone with the command: a crash
    leaves no mount), services kept from starting (policy-rc.d)."""
    debs = "/var/cache/drumsbench-debs"
    _link_host_debs(root / debs.lstrip("/"))
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    script = APT_INSTALL.format(debs=debs, pkgs=" ".join(packages))
    cmd = ["unshare", "--mount", "--propagation", "private", "--fork", "--", "sh", "-c",
           'mount -t proc proc "$1/proc" && exec chroot "$1" /usr/bin/env -i '
           'PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 sh -c "$2"',
           "add", str(root), script]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(root / debs.lstrip("/"), ignore_errors=True)
    policy.unlink(missing_ok=True)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip())[-400:]
        raise SubstrateError(f"installing {' '.join(packages)} into the rootfs failed: {said}")


def ensure_rootfs(flavor: str = "base") -> Path:
    """The cached root filesystem folder of ``flavor``, built first if missing: ``base`` by
    debootstrap (about a minute), ``desktop`` as a copy of ``base`` with ``DESKTOP_INCLUDE`` added
    by apt (under a minute when the host's apt holds the packages, as after setup-desktop.sh) and
    LibreOffice's finalized settings (``office_lockdown``)."""
    target = rootfs_dir(flavor)
    if (target / ".drumsbench-complete").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise SubstrateError("debootstrap is missing: apt-get install debootstrap (or run scripts/setup.sh)")
    base = ensure_rootfs() if flavor != "base" else None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rootfs-build-", dir=target.parent))
    rec = recipe(flavor)
    try:
        if base is None:
            _debootstrap(tmp)
        else:
            proc = subprocess.run(["cp", "-a", f"{base}/.", str(tmp)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SubstrateError(f"copying the base rootfs failed: {proc.stderr.strip()[-300:]}")
            (tmp / ".drumsbench-complete").unlink(missing_ok=True)
            _add_packages(tmp, DESKTOP_INCLUDE)
            office_lockdown.install(tmp)  # macros off for good (drumsbench.office_lockdown)
        _trim(tmp, docs=base is not None)
        (tmp / ".drumsbench-complete").write_text(json.dumps(dict(rec, suite=host_suite())))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _debootstrap(tmp: Path) -> None:
    cmd = [
        "debootstrap",
        f"--variant={RECIPE['variant']}",
        "--include=" + ",".join(INCLUDE),
        host_suite(),
        str(tmp),
        host_mirror(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubstrateError(f"debootstrap failed: {proc.stderr.strip()[-400:] or proc.stdout.strip()[-400:]}")


def ensure_rootfs_tar(flavor: str = "base") -> Path:
    """A tarball of the rootfs of ``flavor`` (numeric owners kept), cached beside it."""
    root = ensure_rootfs(flavor)
    tar = root.with_suffix(".tar")
    if tar.exists():
        return tar
    tmp = tar.with_suffix(".tar.part")
    proc = subprocess.run(
        ["tar", "--numeric-owner", "--exclude=./.drumsbench-complete", "-C", str(root), "-cf", str(tmp), "."],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SubstrateError(f"tar of the rootfs failed: {proc.stderr.strip()[-300:]}")
    tmp.rename(tar)
    return tar
