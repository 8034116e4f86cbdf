"""``bwrap`` sandboxes of a task's image (``BwrapSubstrate.create_from_image``: Harbor tasks).

The sandbox's root is the task image, not the host: the harness (host root, in the host's mount
namespace) mounts an overlayfs whose lower layers are a skeleton (``/sandbox/{work,home,tmp,verify}``)
over **the image's own layer folders as its container engine keeps them** (``LayeredImages``: no
export, no copy) and whose upper layer is the sandbox's, under its host folder; every command is a
fresh ``bwrap`` with that mount as ``/`` (``confinement``, ``kernel_views``: the same namespaces,
capabilities, ``/dev``, ``/proc`` and ``/run`` as the host-view sandbox). Nothing of the host is in
the view: no system folder, no state folder, no hidden path to cover.

Files persist between commands (in the upper layer); processes do not (as for every ``bwrap``
sandbox). ``/tmp`` is the image's ``/tmp`` (written to the upper layer, as on ``overlay``), not a
second name for ``/sandbox/tmp``. Every command gets the image's ``ENV`` under its own. File
methods resolve every absolute path inside the mount (``openat2(RESOLVE_IN_ROOT)``). Reset in
place drops the upper layer and mounts a fresh one. The mount is the host's: ``destroy``, the
substrate's ``close`` and ``gc`` detach it (``unmount_below``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import SandboxPaths
from drumsbench.substrates.bwrap import IN_ROOT, BwrapSandbox, confinement, kernel_views
from drumsbench.substrates.hostproc import CgroupFreezable, FreezerCgroup, unmount_below
from drumsbench.substrates.layer_mounts import mountable
from drumsbench.substrates.process import HostFolderSandbox


class BwrapImageSandbox(BwrapSandbox):
    """``box``: the sandbox's host folder (``upper``, ``wk``, ``root``: the mount, which is
    ``host_root``); ``lower``: the skeleton and the image's layers, top first."""

    def __init__(self, run_id: str, sid: str, box: Path, lower: Sequence[str], env: Mapping[str, str],
                 cgroup: FreezerCgroup | None = None):
        self.box = box
        self._lower = ":".join(mountable(p, "bwrap") for p in lower)
        self.image_env = dict(env)
        self._mount()
        try:
            super().__init__(run_id, sid, box / "root", (), cgroup=cgroup)
        except BaseException:
            unmount_below(box)
            raise
        self.paths = SandboxPaths.under(IN_ROOT)
        self._prefix = [*confinement(), "--bind", str(self.host_root), "/", *kernel_views()]

    def _mount(self) -> None:
        for sub in ("upper", "wk", "root"):
            (self.box / sub).mkdir(exist_ok=True)
        upper = mountable(str(self.box / "upper"), "bwrap")
        opts = f"lowerdir={self._lower},upperdir={upper},workdir={self.box / 'wk'}"
        proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.box / "root")],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise SubstrateError(f"bwrap: cannot mount the image's layers: {proc.stderr.strip() or proc.returncode}")

    def _make_folders(self) -> None:
        """The sandbox's folders come with the skeleton layer."""

    # -- mapping: the whole root is the sandbox's ------------------------------------------------
    def host_path(self, path: str) -> Path:
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        norm = os.path.normpath(path)
        if not norm.startswith("/"):
            raise SubstrateError(f"{path!r} is not an absolute path")
        return self.host_root / norm.lstrip("/") if norm != "/" else self.host_root

    _rel = HostFolderSandbox._rel

    def _host_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str] | None, *, launcher: bool = False,
                      pinned: Mapping[str, str] | None = None,
                      stream: bool = False) -> tuple[list[str], str | None, dict[str, str]] | None:
        """As for every host-folder sandbox, with the image's ``ENV`` under the command's own, and
        the working folder looked up inside the mount (``None`` when it is not a folder there)."""
        if not launcher and not self._fs.is_dir(self._rel(cwd)):
            return None
        return super()._host_command(argv, cwd, {**self.image_env, **(env or {})}, launcher=launcher,
                                     pinned=pinned, stream=stream)

    def _argv(self, argv: list[str], cwd: str, env: dict[str, str], *,
              stream: bool = False) -> tuple[list[str], str | None, dict[str, str]]:
        prefix = [a for a in self._prefix if a != "--die-with-parent"] if stream else self._prefix
        # the host-side bwrap starts in the mount's root; the command, in its folder inside
        return [*prefix, "--chdir", os.path.normpath(cwd), "--", *argv], str(self.host_root), env

    # -- lifecycle -------------------------------------------------------------------------------
    def reset_in_place(self) -> None:
        """Every process ends; the upper layer goes and a fresh one is mounted (the image's files)."""
        self._thaw_for_kill()
        self.kill_all()
        unmount_below(self.host_root)
        for sub in ("upper", "wk"):
            shutil.rmtree(self.box / sub, ignore_errors=True)
        self._mount()

    def destroy(self) -> None:
        if self._destroyed:
            return
        super().destroy()
        unmount_below(self.box)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.box)


class FreezableBwrapImageSandbox(CgroupFreezable, BwrapImageSandbox):
    """An image sandbox with a freezer cgroup."""
