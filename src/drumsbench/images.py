"""The Debian root filesystem that container-like substrates run in, built from Debian's packages.

Contract: ``ensure_rootfs()`` returns a folder holding a complete root filesystem built by
``debootstrap --variant=minbase`` from the mirror this host's apt already uses, for the suite of
this host. It is cached under ``cache_dir()/rootfs-<recipe hash>``; a folder is only ever
published complete (built in a temporary folder, then renamed), so a crash mid-build leaves
nothing that looks usable. A change of ``RECIPE`` changes the hash and so rebuilds.
``ensure_rootfs_tar()`` returns a tarball of it (for ``docker import`` / ``podman import``).
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

from drumsbench.core.errors import SubstrateError

INCLUDE = ["python3", "git", "procps", "ca-certificates"]
RECIPE: dict[str, object] = {
    "variant": "minbase",
    "include": INCLUDE,
    "version": 1,
}


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


def recipe_hash() -> str:
    full = dict(RECIPE, suite=host_suite())
    return hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:12]


def rootfs_tag() -> str:
    """Image tag for container engines: changes whenever the recipe does."""
    return f"drumsbench-rootfs:{recipe_hash()}"


def ensure_rootfs() -> Path:
    """The cached root filesystem folder, built first if missing (about a minute)."""
    target = cache_dir() / f"rootfs-{recipe_hash()}"
    if (target / ".drumsbench-complete").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise SubstrateError("debootstrap is missing: apt-get install debootstrap (or run scripts/setup.sh)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rootfs-build-", dir=target.parent))
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
        shutil.rmtree(tmp, ignore_errors=True)
        raise SubstrateError(f"debootstrap failed: {proc.stderr.strip()[-400:] or proc.stdout.strip()[-400:]}")
    # Trim what no sandbox needs: apt lists and caches.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (tmp / junk).glob("*"):
            if p.is_file():
                p.unlink()
    (tmp / ".drumsbench-complete").write_text(json.dumps(dict(RECIPE, suite=host_suite())))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def ensure_rootfs_tar() -> Path:
    """A tarball of the rootfs (numeric owners kept), cached beside it."""
    root = ensure_rootfs()
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
