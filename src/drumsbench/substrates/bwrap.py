"""``bwrap``: every command runs in a fresh bubblewrap sandbox over a read-only view of the host.

What a command sees:

- ``/`` is the host's system, read-only: each top-level entry of ``answer_keys.SYSTEM_FOLDERS``
  (``/usr``, ``/etc``, ``/var``, ...) bound read-only onto a read-only tmpfs root, so that the
  sandbox folder can sit at the fixed path ``/sandbox``; the others (``/work``, ``/home``, ``/opt``,
  ...: checkouts, task suites) are absent, and the harness's package, checkout and the run's suite
  (``Substrate.hidden``) are covered by empty tmpfs wherever they are. ``/run`` is an
  empty tmpfs (hides host sockets such as the docker socket); the state folder (so one sandbox
  cannot read another's files), ``/root`` and the image cache are hidden by empty tmpfs too.
- ``/sandbox`` is the sandbox's host folder, read-write, with ``work``, ``home``, ``tmp`` and
  ``verify``. ``HOME=/sandbox/home``, ``TMPDIR=/sandbox/tmp``; ``/tmp`` is *the same folder* as
  ``/sandbox/tmp`` (private to the sandbox, kept between its commands, emptied by reset, searched
  by the canary scan) rather than a throwaway tmpfs per command.
- Fresh ``/dev`` and ``/proc`` (``/proc/sys``, ``/proc/sysrq-trigger``, ... read-only: uid 0
  inside is host root, so the kernel's knobs must not be writable); new user (uid 0 mapped to
  host root), mount, pid, ipc, uts, cgroup and network namespaces (``--unshare-all``): the only
  network interface is ``lo``.
- Capabilities: docker's default set minus ``mknod``, ``sys_chroot`` and ``setfcap``; never
  ``sys_admin``, so the read-only mounts cannot be remounted.

Semantics of processes: bubblewrap 0.8 cannot enter a running sandbox, so **each command gets its
own pid and network namespace, and a command's background processes are killed when the command
ends** (its ``bwrap`` init exits and the kernel kills the rest of the pid namespace). Files
persist between commands; processes and network listeners do not. A task that needs a server
living across steps needs a substrate with a long-lived sandbox (``overlay``, containers).

File methods act on the host folder directly (no process is started), resolving paths with
``openat2(RESOLVE_IN_ROOT)`` so links made inside the sandbox cannot point them at host files.

Commands run as uid 0 of a user namespace that maps it to host root, but in their own pid
namespace: the harness and other sandboxes' processes have no pid a command could name, so no uid
of its own is needed (``process`` gives each sandbox one). Where the v1 freezer hierarchy is
mounted, every ``bwrap`` is placed in the sandbox's freezer cgroup by the same root-run wrapper as
``process`` (``FreezableBwrapSandbox``), with the same ``probe`` and ``end_processes``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.answer_keys import SYSTEM_FOLDERS
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates import rootedfs
from drumsbench.substrates.base import (
    SANDBOX_FOLDERS,
    Capabilities,
    ExecRequest,
    ExecResult,
    HostLaunching,
    ImageRecipe,
    Isolation,
    LaunchView,
    RecipeImages,
    ResetStrategy,
    Sandbox,
    SandboxLimits,
    SandboxPaths,
    Substrate,
    ViewLaunching,
)
from drumsbench.substrates.containers.layered_images import LayeredImages
from drumsbench.substrates.hostproc import (
    VIEW_APP_UID,
    CgroupFreezable,
    FreezerCgroup,
    give_folders,
    mount_limited,
    unmount_below,
)
from drumsbench.substrates.process import (
    SHARED_BASE,
    HostFolderSandbox,
    gc_host_runs,
    host_leftovers,
    host_limit_mechanisms,
    new_sandbox_id,
)

IN_ROOT = "/sandbox"
IMAGE_SKELETON = "_skeleton"  # under the run's folder: the top lower layer of image sandboxes (bwrap_image)

# docker's default capability set, less mknod, sys_chroot and setfcap. Shared with ``overlay``.
SANDBOX_CAPS = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "audit_write",
)

# What a command entered into a sandbox's namespaces as root runs through to get the privileges of the
# sandbox's own commands: that capability set, nothing inheritable, no new privileges. Shared with ``overlay``.
SETPRIV_CONFINE = (
    "/usr/bin/setpriv",
    "--bounding-set=-all," + ",".join(f"+{c}" for c in SANDBOX_CAPS),
    "--inh-caps=-all",
    "--no-new-privs",
    "--",
)

# /proc entries a sandbox may read but never write (as docker does). Shared with ``overlay``.
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")

# Top-level host entries not bound into the sandbox (replaced or hidden).
_NOT_BOUND = {"proc", "dev", "tmp", "run", "sandbox", "lost+found"}


def run_folder(state_dir: Path, run_id: str) -> Path:
    return state_dir / "bwrap" / run_id


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def confinement() -> list[str]:
    """bwrap's namespaces and capabilities, the same for every sandbox (no file system view)."""
    argv = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    for cap in SANDBOX_CAPS:
        argv += ["--cap-add", f"CAP_{cap.upper()}"]
    return argv


def kernel_views() -> list[str]:
    """Fresh ``/dev``, ``/proc`` (its knobs read-only: uid 0 inside is host root) and an empty ``/run``."""
    argv = ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
    for sub in PROC_READONLY:
        if os.path.exists(f"/proc/{sub}"):
            argv += ["--ro-bind", f"/proc/{sub}", f"/proc/{sub}"]
    return argv


def bwrap_prefix(host_root: Path, hide: Sequence[Path]) -> list[str]:
    """bwrap arguments for a sandbox whose folder is ``host_root`` (all but cwd and command)."""
    argv = confinement()
    for name in sorted(os.listdir("/")):
        if name in _NOT_BOUND or name not in SYSTEM_FOLDERS:  # the rest may hold answer keys
            continue
        host = f"/{name}"
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.exists(host):
            argv += ["--ro-bind", host, host]
    argv += kernel_views()
    for h in sorted(set(hide)):
        # Only where the folder is visible through a read-only bind (not under /tmp, /run, ...)
        # and not already inside another hidden folder.
        top = h.parts[1] if len(h.parts) > 1 else ""
        if any(o in h.parents for o in hide):
            continue
        if top and top not in _NOT_BOUND and h.is_dir():
            argv += ["--tmpfs", str(h), "--remount-ro", str(h)]
    argv += [
        "--bind", str(host_root), IN_ROOT,
        "--bind", str(host_root / "tmp"), "/tmp",
        "--remount-ro", "/",
    ]  # fmt: skip
    return argv


class BwrapSandbox(HostFolderSandbox, HostLaunching, ViewLaunching):
    """Host folder ``host_root`` is ``/sandbox`` inside; ``/tmp`` inside is ``/sandbox/tmp``.

    ``launch_view``: a long-lived ``bwrap`` with the view every command gets (without
    ``--die-with-parent``: the launched tree is labelled, and ends with the sandbox's reset or
    destroy, or ``gc``), plus ``CAP_SYS_ADMIN``/``CAP_NET_ADMIN`` inside its own namespaces for the
    launched command's set-up; ``exec_launcher`` runs ``nsenter`` on the host as root, in the
    sandbox's cgroup, labelled."""

    def __init__(
        self, run_id: str, sid: str, host_root: Path, hide: Sequence[Path], cgroup: FreezerCgroup | None = None
    ):
        super().__init__("bwrap", run_id, sid, host_root, SandboxPaths.under(IN_ROOT), cgroup=cgroup)
        self._prefix = bwrap_prefix(host_root, hide)

    def launch_view(self) -> LaunchView:
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        # no user namespace of its own (bwrap run by root needs none): its one mapping (root alone)
        # leaves no other uid to drop to, so the tree's applications (LibreOffice) could only be
        # root; without it they run as ``VIEW_APP_UID``, with the sandbox's folders handed to it
        prefix = [a for a in self._prefix if a != "--die-with-parent"]
        at = prefix.index("--unshare-all")
        prefix[at:at + 1] = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        prefix += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_NET_ADMIN", "--chdir", self.paths.work, "--"]
        return LaunchView(tuple(prefix), self.host_root, IN_ROOT, SETPRIV_CONFINE, drop_admin=True,
                          app_ids=give_folders(self.host_root, VIEW_APP_UID))

    def exec_launcher(self, argv: Sequence[str], **options: Any) -> ExecResult:
        """A harness-made launcher (``nsenter`` into a launched tree) as root on the host: in the
        sandbox's cgroup, labelled, bounded, killed on timeout and by ``end_processes``/``destroy``."""
        cwd = options.pop("cwd", None) or self.paths.work
        return self._run_as(ExecRequest(list(argv), cwd=cwd, **options), uid=None, launcher=True)

    # -- mapping -------------------------------------------------------------------------------
    def _rel(self, path: str) -> str:
        """Path relative to the sandbox folder; ``/tmp/...`` is ``tmp/...``."""
        norm = os.path.normpath(path)
        if not norm.startswith("/"):
            raise SubstrateError(f"{path!r} is not an absolute path")
        if _inside(norm, "/tmp"):
            return os.path.relpath(norm, "/") if norm != "/tmp" else "tmp"
        if _inside(norm, IN_ROOT):
            return os.path.relpath(norm, IN_ROOT)
        raise SubstrateError(f"{path!r} is outside sandbox {self.id} ({IN_ROOT})")

    def host_path(self, path: str) -> Path:
        rel = self._rel(path)
        return self.host_root if rel == "." else self.host_root / rel

    def _argv(
        self, argv: list[str], cwd: str, env: dict[str, str], *, stream: bool = False
    ) -> tuple[list[str], str | None, dict[str, str]]:
        norm = os.path.normpath(cwd)
        host_cwd: str | None = None
        if _inside(norm, IN_ROOT) or _inside(norm, "/tmp"):
            # Checked by exec: a vanished working folder fails the command, as for ``process``.
            host_cwd = str(self.host_path(norm))
        # A stream outlives the harness thread that starts it, and bwrap's --die-with-parent is a
        # parent-death signal, sent when that *thread* ends: not for streams (their token, group and
        # cgroup kill them; a crashed harness leaves them labelled for gc, their stdin at EOF).
        prefix = [a for a in self._prefix if a != "--die-with-parent"] if stream else self._prefix
        return [*prefix, "--chdir", norm, "--", *argv], host_cwd, env

    def _run(self, req: ExecRequest) -> ExecResult:
        res = super()._run(req)
        # When bwrap has exited, its pid namespace is gone with every process of the command:
        # forget process groups that have no member left, before the kernel reuses their ids.
        self.groups.forget_empty()
        return res

    # -- files: digest and scan walk the rooted folder, not host paths (links resolve inside) ----
    tree_digest = rootedfs.RootedFiles.tree_digest
    scan = rootedfs.RootedFiles.scan
    _read_failed = rootedfs.RootedFiles._read_failed  # a path through a file is not "missing" here


class FreezableBwrapSandbox(CgroupFreezable, BwrapSandbox):
    """A bwrap sandbox with a freezer cgroup: the host can freeze it (fault injection)."""


class BwrapSubstrate(Substrate, RecipeImages):
    """Sandboxes over a read-only view of the host (``create``), or of a task's image
    (``create_from_image``: ``bwrap_image``)."""

    name = "bwrap"
    sandbox_class = BwrapSandbox
    capabilities = Capabilities(
        isolation=Isolation.NAMESPACES,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        network=False,
        notes=(
            "bubblewrap per command: host root read-only, sandbox folder at /sandbox, /tmp private "
            "to the sandbox, no network but lo; processes do not outlive their command; Freezable "
            "(cgroup v1 freezer) only where /sys/fs/cgroup/freezer is mounted and writable"
        ),
    )

    @classmethod
    def missing(cls) -> str | None:
        if shutil.which("bwrap") is None:
            return "bubblewrap is missing: apt-get install bubblewrap (or run scripts/setup.sh)"
        if not rootedfs.available():
            return "openat2(2) is unavailable: the bwrap substrate needs Linux >= 5.6"
        return None

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self._folder = run_folder(state_dir, run_id)
        # Folders a sandbox must not see: the state (every run's sandboxes), root's home and the
        # image cache (credentials, container engines' sockets such as podman's attach sockets).
        self._hide = [
            Path(os.path.realpath(p))
            for p in (state_dir, os.path.expanduser("~root"), images.cache_dir(), SHARED_BASE)
        ]
        self.freezer = FreezerCgroup.hierarchy() is not None
        self.images = LayeredImages(self.name, run_id, state_dir)  # task images (RecipeImages)

    def raw_floor(self) -> list[str] | None:
        """A plain bubblewrap around `true`, as harnesses commonly start one."""
        return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--unshare-all", "--die-with-parent", "true"]

    def raw_floor_of(self, image: str) -> list[str] | None:
        """A hand-written harness's bubblewrap over a task image: in a private mount namespace, an
        overlay of the image's layer folders on a tmpfs upper, bwrap with it as ``/`` around `true`."""
        layout = self.images.known(image)
        if layout is None:
            return None
        from drumsbench.substrates.layer_mounts import FLOOR_MOUNT

        script = f'{FLOOR_MOUNT} && bwrap --bind "$d/m" / --dev /dev --proc /proc --unshare-all ' \
            '--die-with-parent /bin/true'
        return ["unshare", "--mount", "sh", "-c", script, "floor", ":".join(layout.layers)]

    def build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages.build_recipe``: built by a container engine, run from its layer folders
        (``LayeredImages``). ``SubstrateError`` for a non-root ``USER``."""
        return self.images.build(recipe)

    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> Sandbox:
        """``RecipeImages.create_from_image``: a sandbox whose ``/`` is an overlay of the image's
        layers under the sandbox's own upper layer (``bwrap_image``)."""
        from drumsbench.substrates.bwrap_image import BwrapImageSandbox, FreezableBwrapImageSandbox
        from drumsbench.substrates.layer_mounts import make_skeleton

        layout = self.images.layout(image)
        limits = limits or self.limits
        sid = new_sandbox_id()
        box = self._folder / sid
        try:
            box.mkdir(parents=True)
            if limits.disk_bound_mb is not None and self.freezer:
                mount_limited(box, limits.disk_bound_mb)  # the upper layer: all the sandbox writes
            lower = (str(make_skeleton(self._folder / IMAGE_SKELETON)), *layout.layers)
        except (OSError, SubstrateError) as e:
            unmount_below(box)
            shutil.rmtree(box, ignore_errors=True)
            raise SubstrateError(f"bwrap: cannot create sandbox folder {box}: {e}") from e
        cgroup = None
        try:
            if self.freezer:
                cgroup = FreezerCgroup.create(self.run_id, f"{self.name}-{sid}", limits=limits)
                return FreezableBwrapImageSandbox(self.run_id, sid, box, lower, layout.env, cgroup)
            return BwrapImageSandbox(self.run_id, sid, box, lower, layout.env)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            unmount_below(box)
            shutil.rmtree(box, ignore_errors=True)
            raise

    def create(self) -> Sandbox:
        sid = new_sandbox_id()
        root = self._folder / sid
        try:
            root.mkdir(parents=True)
            if self.limits.disk_bound_mb is not None and self.freezer:
                mount_limited(root, self.limits.disk_bound_mb)  # /sandbox and /tmp inside
            for sub in SANDBOX_FOLDERS:
                (root / sub).mkdir()
            (root / "tmp").chmod(0o1777)
        except (OSError, SubstrateError) as e:
            unmount_below(root)
            shutil.rmtree(root, ignore_errors=True)
            raise SubstrateError(f"bwrap: cannot create sandbox folder {root}: {e}") from e
        hide = [*self._hide, *self.hidden]
        if not self.freezer:
            return BwrapSandbox(self.run_id, sid, root, hide)
        try:
            cgroup = FreezerCgroup.create(self.run_id, f"{self.name}-{sid}", limits=self.limits)
        except SubstrateError:
            unmount_below(root)
            shutil.rmtree(root, ignore_errors=True)
            raise
        return FreezableBwrapSandbox(self.run_id, sid, root, hide, cgroup)

    def limit_mechanisms(self) -> dict[str, str]:
        return host_limit_mechanisms(self.limits, self.freezer, "the sandbox folder (/sandbox and /tmp inside; "
                                     "the rest of / is read-only)")

    def close(self) -> None:
        self.images.close()
        for cg in FreezerCgroup.of_run(self.run_id, f"{self.name}-"):
            cg.remove()
        unmount_below(self._folder)
        shutil.rmtree(self._folder / IMAGE_SKELETON, ignore_errors=True)
        if self._folder.is_dir() and not any(self._folder.iterdir()):
            self._folder.rmdir()

    def leftovers(self) -> list[str]:
        return host_leftovers(self.run_id, self._folder, f"{self.name}-")

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        return gc_host_runs(dead_runs, lambda run: run_folder(state_dir, run))
