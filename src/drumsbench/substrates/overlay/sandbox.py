"""``overlay``: namespaces + overlayfs over the project's Debian root filesystem, with O(1) fork.

Each sandbox is one long-lived *holder* process: pid 1 of its own pid, mount, ipc, uts and network
namespaces (only ``lo``), whose root is an overlay of

    upper (per sandbox, writable)  over  [snapshot layers]  over  skeleton  over  Debian rootfs

where the skeleton holds the empty ``/sandbox/{work,home,tmp,verify}`` and the rootfs is
``images.ensure_rootfs()``. The holder pivots into the overlay, so the host's file system is not
reachable from the sandbox's mount namespace. Holders are forked by one warm fork server per run
(``namespace_init.py``), which makes a sandbox cost a fork rather than an interpreter start.

Commands enter the holder's namespaces with the entry helper (``entry.py``, ``enter.c``) and run as
uid 0 with docker's default capabilities less ``mknod``, ``sys_chroot`` and ``setfcap``, so they can
own the sandbox's files but cannot mount, make device nodes or regain capabilities; the helper runs
no program of the sandbox before it has dropped the rest (the sandbox's ``env`` or ``setpriv``,
replaced by an earlier command, would otherwise run as host root with every capability). Processes of a sandbox
live on between commands (a server started by one command is reachable on ``127.0.0.1`` by the
next) until reset, snapshot or destroy.

The overlay and its submounts exist only in the holder's private mount namespace and vanish
with it, however the run ends. Holders die with the fork server, which dies when the harness
closes its stdin (also on a crash). The one host mount is the disk bound (``limits.disk_bound_mb``,
on by default): a tmpfs of that size on the sandbox's folder ``sb/<id>``, which holds its upper
and work layers, so that everything the sandbox writes ends at ENOSPC there; ``destroy``,
``close`` and ``gc`` (after a crash) unmount it. With the bound on, ``snapshot()`` copies the
upper layer into the layer store (``cp -a``) instead of renaming it. Where the v1 pids and memory
hierarchies exist, the holder and every command are also in the sandbox's pids and memory groups.

Reset in place discards the upper layer: the holder is killed (the kernel kills its pid namespace
and drops its mounts), a fresh upper is made, a new holder mounts it; the old upper is renamed
away and deleted on a background thread. Overlays are mounted ``volatile`` (no sync of the upper
file system at unmount: an upper layer is never needed after a host crash). Snapshot/fork:
``snapshot()`` freezes the sandbox's current upper layer (it is renamed into the run's layer store
and never written again) and the sandbox continues on a fresh upper stacked on it; ``fork(id)``
creates a sandbox whose lower layers start with the frozen one: no file is copied. Snapshots hold
files only; a snapshot kills the sandbox's running processes (as a reset does).

File methods read and write through ``/proc/<holder>/root`` with ``openat2(RESOLVE_IN_ROOT)``: no
process is started, and links inside the sandbox resolve as they do inside it.

Commands run as uid 0 (no user namespace) but in the holder's pid namespace, so the harness and
other sandboxes' processes have no pid they could name; no uid of its own is needed. Where the v1
freezer hierarchy is mounted, each sandbox gets a freezer cgroup holding its holder and every
command (the entry helper is placed by the same root-run wrapper as ``process``'s commands), and is
``Freezable`` (``FreezableOverlaySandbox``). ``end_processes`` kills every process of the holder's
pid namespace but the holder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates import rootedfs
from drumsbench.substrates.base import (
    Capabilities,
    ExecRequest,
    ExecResult,
    Forking,
    HostLaunching,
    ImageRecipe,
    Isolation,
    LaunchView,
    PortableSnapshots,
    RecipeImages,
    ResetStrategy,
    SandboxLimits,
    SandboxPaths,
    Snapshotting,
    Stream,
    Streaming,
    Substrate,
    ViewLaunching,
)
from drumsbench.substrates.bwrap import SETPRIV_CONFINE
from drumsbench.substrates.containers.layered_images import LayeredImages
from drumsbench.substrates.exec_core import (
    EXEC_VAR,
    EndedStream,
    ProcessGroups,
    missing_workdir,
    sandbox_env,
    start_stream,
)
from drumsbench.substrates.hostproc import (
    VIEW_APP_UID,
    CgroupFreezable,
    FreezerCgroup,
    cgroup_leftovers,
    give_folders,
    host_probe,
    kill_pids,
    mount_limited,
    pids_with_env,
    unmount_below,
)
from drumsbench.substrates.layer_mounts import FLOOR_MOUNT, make_skeleton, mountable
from drumsbench.substrates.overlay import entry
from drumsbench.substrates.overlay.forkserver import ForkServer, Trash, cached_rootfs, host_mounts_below, wait_pidfd
from drumsbench.substrates.process import RUN_VAR, SANDBOX_VAR, new_sandbox_id

IN_ROOT = "/sandbox"
SKELETON = "layers/_skeleton"
ENTER_VIEW = Path(__file__).with_name("enter_view.py")
_UNSHARE = ("unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "--mount", "--mount-proc",
            "--propagation", "private", "--")
_KILL_WAIT_S = 10.0


class _Snapshot(NamedTuple):
    """A snapshot: its lower layers top first, and the image ``ENV`` its forks' commands get."""

    chain: tuple[str, ...]
    env: Mapping[str, str]


def run_folder(state_dir: Path, run_id: str) -> Path:
    return state_dir / "overlay" / run_id


class OverlaySandbox(rootedfs.RootedFiles, Snapshotting, HostLaunching, ViewLaunching, Streaming):
    """``launch_view``: ``enter_view.py`` (the sandbox's mount namespace, copied, with the host's
    ``/usr`` and a few ``/etc`` files read-only over its own) and then ``unshare`` (new pid, ipc,
    uts, net and mount namespaces): an environment's own processes outside the holder's pid
    namespace, labelled, writing into the sandbox's upper layer. Once a sandbox has launched, its
    reset, snapshot, ``end_processes`` and destroy also kill every process carrying its label.
    ``exec_launcher`` runs ``nsenter`` on the host as root, in the sandbox's cgroup, labelled."""

    cgroup: FreezerCgroup | None

    def __init__(
        self, sub: OverlaySubstrate, sid: str, base: tuple[str, ...], cgroup: FreezerCgroup | None = None,
        limits: SandboxLimits | None = None,
    ) -> None:
        self.substrate = sub.name
        self.run_id = sub.run_id
        self.id = sid
        self.paths = SandboxPaths.under(IN_ROOT)
        self._sub = sub
        self._dir = sub.folder / "sb" / sid
        self._base = base  # lower layers of the start state, top first (relative to the run folder)
        self.image_env: Mapping[str, str] = {}  # a task image's ENV (create_from_image), under every command's
        self._extra: list[str] = []  # layers frozen by snapshot() since the start, top first
        self._gen = 0
        self._pid = 0
        self._pidfd = -1
        self.groups = ProcessGroups()
        self._lock = threading.RLock()
        self._destroyed = False
        self._launched = False  # launch_view was used: labelled processes live outside the holder
        self.cgroup = cgroup
        try:
            self._dir.mkdir(parents=True)
            disk = (limits or sub.limits).disk_bound_mb
            if disk is not None and sub.freezer:
                # the disk bound: upper and work layers live on a tmpfs of that size
                mount_limited(self._dir, disk)
            (self._dir / "m").mkdir()
        except (OSError, SubstrateError) as e:
            unmount_below(self._dir)
            shutil.rmtree(self._dir, ignore_errors=True)
            raise SubstrateError(f"overlay: cannot create sandbox folder {self._dir}: {e}") from e
        try:
            self._start()
        except BaseException:
            unmount_below(self._dir)
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    # -- holder lifecycle ------------------------------------------------------------------------
    def _layer_dirs(self) -> tuple[str, str]:
        return f"sb/{self.id}/u{self._gen}", f"sb/{self.id}/w{self._gen}"

    def _start(self) -> None:
        self._gen += 1
        upper, work = self._layer_dirs()
        for d in (upper, work):
            (self._sub.folder / d).mkdir()
        reply = self._sub.server().request(
            {
                "op": "spawn",
                "cwd": str(self._sub.folder),
                "lower": [*self._extra, *self._base],
                "upper": upper,
                "work": work,
                "merged": f"sb/{self.id}/m",
                "hostname": f"sandbox-{self.id}",
                # Upper layers are thrown away or frozen, never needed after a host crash:
                # skip the sync of the upper file system at unmount.
                "volatile": True,
            }
        )
        if "pid" not in reply:
            raise SubstrateError(f"overlay: cannot start sandbox {self.id}: {reply.get('error')}")
        self._pid = int(reply["pid"])
        try:
            self._pidfd = os.pidfd_open(self._pid)
        except OSError as e:
            raise SubstrateError(f"overlay: sandbox {self.id} died at start: {e}") from e
        if self.cgroup is not None:
            # The holder starts nothing by itself: placing it now, before any command, is race-free.
            try:
                self.cgroup.place(self._pid)
            except OSError as e:
                raise SubstrateError(f"overlay: cannot place sandbox {self.id} in {self.cgroup.path}: {e}") from e

    def _stop(self, sweep: bool = False) -> None:
        """Kill the holder (the kernel kills its pid namespace) and the running entry helpers.

        Every process inside dies with the holder; outside it there are only the entry helpers,
        parents of running commands, killed by group. ``sweep`` also kills any process still
        carrying the sandbox's label (a scan of /proc: for destroy, not for the hot reset path).
        A frozen sandbox is thawed first (frozen tasks cannot die).
        """
        if self.cgroup is not None:
            self.cgroup.thaw_for_kill()
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            gone = wait_pidfd(self._pidfd, _KILL_WAIT_S)
            os.close(self._pidfd)
            self._pidfd = -1
            if not gone:
                raise SubstrateError(f"overlay: sandbox {self.id} holder {self._pid} does not die")
        self.groups.kill()
        if sweep or self._launched:
            kill_pids(list(pids_with_env(SANDBOX_VAR, self.id)))

    def _alive(self) -> bool:
        return self._pidfd >= 0 and not wait_pidfd(self._pidfd, 0)

    def _discard(self, *rel: str) -> None:
        for d in rel:
            self._sub.trash.put(self._sub.folder / d)

    # -- paths -----------------------------------------------------------------------------------
    @staticmethod
    def _rel(path: str) -> str:
        norm = os.path.normpath(path)
        if not norm.startswith("/"):
            raise SubstrateError(f"{path!r} is not an absolute path")
        return norm.lstrip("/") or "."

    def _rooted(self) -> rootedfs.RootedFS:
        with self._lock:
            if self._destroyed:
                raise SubstrateError(f"sandbox {self.id} is destroyed")
            if not self._alive():
                raise SubstrateError(f"sandbox {self.id}: its holder process is gone")
            return rootedfs.RootedFS(f"/proc/{self._pid}/root")

    # -- interface -------------------------------------------------------------------------------
    def _enter_argv(self, argv: Sequence[str], workdir: str) -> list[str]:
        """The host command that runs ``argv`` inside the sandbox (its namespaces, cgroups and
        privileges): ``entry.argv``, which runs no program of the sandbox before it drops them."""
        host_argv = entry.argv(self._pid, workdir, argv)
        return host_argv if self.cgroup is None else self.cgroup.wrap(host_argv)

    def _run(self, req: ExecRequest) -> ExecResult:
        workdir = os.path.normpath(req.cwd)
        if not self._rooted().is_dir(self._rel(workdir)):
            return missing_workdir(workdir)
        env = sandbox_env(self.paths, {**self.image_env, **(req.env or {})},
                          labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id})
        # Afterwards the group's leader is reaped: its id is forgotten before the kernel can reuse
        # it. What the command left running lives in the pid namespace and dies with the holder.
        return self.groups.run(self._enter_argv(req.argv, workdir), req, cwd=None, env=env, forget_all=True)

    def open_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Stream:
        """``Streaming``: entered as ``exec`` enters a command; its entry helper in a session of its own,
        counted in the sandbox's process groups, the command marked with a token that ``close`` kills."""
        workdir = os.path.normpath(cwd or self.paths.work)
        if not self._rooted().is_dir(self._rel(workdir)):
            return EndedStream(126)
        token = uuid.uuid4().hex
        full = sandbox_env(self.paths, {**self.image_env, **(env or {})},
                           labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id}, pinned={EXEC_VAR: token})
        return start_stream(self._enter_argv(argv, workdir), cwd=None, env=full, groups=self.groups, token=token)

    def end_processes(self) -> None:
        """Kill every process of the holder's pid namespace but the holder, and running entry helpers."""
        with self._lock:
            if self._destroyed or not self._alive():
                return
            holder = self._pid
            try:
                ns = os.readlink(f"/proc/{holder}/ns/pid")
            except OSError:
                return
        self.groups.kill()
        if self._launched:
            kill_pids(list(pids_with_env(SANDBOX_VAR, self.id)))
        for _ in range(3):  # what forked while a pass ran
            victims = []
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) != holder:
                    try:
                        if os.readlink(f"/proc/{name}/ns/pid") == ns:
                            victims.append(int(name))
                    except OSError:
                        continue
            if not victims:
                return
            kill_pids(victims)

    @property
    def uid(self) -> int | None:
        """None: the sandbox's commands run as root of its own view (``HostLaunching``)."""
        return None

    def launch_view(self) -> LaunchView:
        with self._lock:
            if self._destroyed or not self._alive():
                raise SubstrateError(f"sandbox {self.id} is destroyed or its holder is gone")
            self._launched = True
            python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
            prefix = (python, "-I", "-S", str(ENTER_VIEW), str(self._pid), "--", *_UNSHARE)
            host_root = Path(f"/proc/{self._pid}/root{IN_ROOT}")
            # the tree's applications (LibreOffice) as an unprivileged uid, never the view's root
            return LaunchView(prefix, host_root, IN_ROOT, SETPRIV_CONFINE, drop_admin=True,
                              app_ids=give_folders(host_root, VIEW_APP_UID))

    def exec_launcher(self, argv: Sequence[str], **options: Any) -> ExecResult:
        """A harness-made launcher (``nsenter`` into a launched tree) as root on the host: in the
        sandbox's cgroup, labelled, bounded, killed on timeout and by ``end_processes``/``destroy``."""
        options.pop("cwd", None)  # a host command: the launcher enters its working folder inside
        req = ExecRequest(list(argv), cwd=self.paths.work, **options)
        env = sandbox_env(self.paths, req.env, labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id})
        host_argv = list(argv)
        if self.cgroup is not None:
            host_argv = self.cgroup.wrap(host_argv)
        return self.groups.run(host_argv, req, cwd=None, env=env, forget_all=True)

    def probe(self, timeout: float = 5.0) -> str | None:
        return host_probe(self.id, self._destroyed, self.cgroup, lambda: None if self._alive()
                          else f"the sandbox's holder process {self._pid} is gone")

    def reset_in_place(self) -> None:
        """Back to the start state: processes killed, upper layer (and later snapshots) dropped."""
        with self._lock:
            if self._destroyed:
                raise SubstrateError(f"sandbox {self.id} is destroyed")
            self._stop()
            old = self._layer_dirs()
            self._extra = []
            self._start()
        self._discard(*old)

    def snapshot(self) -> str:
        """Freeze the current files as a layer; returns its id for ``OverlaySubstrate.fork``.

        O(1) with the disk bound off: the upper layer is renamed, not copied (with it on, copied off
        the sandbox's tmpfs: O(what the sandbox wrote)). The sandbox's processes are killed; the
        sandbox continues with the same files on a fresh upper layer.
        """
        with self._lock:
            if self._destroyed:
                raise SubstrateError(f"sandbox {self.id} is destroyed")
            self._stop()
            upper, work = self._layer_dirs()
            snap = uuid.uuid4().hex[:12]
            layer = f"layers/{snap}"
            try:
                _move_layer(self._sub.folder / upper, self._sub.folder / layer)
            except OSError as e:
                raise SubstrateError(f"overlay: cannot freeze the upper of {self.id}: {e}") from e
            self._extra.insert(0, layer)
            self._sub.register_snapshot(snap, (*self._extra, *self._base), self.image_env)
            self._start()
        self._discard(work)
        return snap

    def destroy(self) -> None:
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            try:
                self._stop(sweep=True)
            finally:
                if self.cgroup is not None:
                    self.cgroup.remove()
                unmount_below(self._dir)  # the disk bound's tmpfs
                shutil.rmtree(self._dir, ignore_errors=True)
                self._sub.forget(self)

    @property
    def holder_pid(self) -> int:
        return self._pid


class FreezableOverlaySandbox(CgroupFreezable, OverlaySandbox):
    """An overlay sandbox with a freezer cgroup (holder and commands): the host can freeze it."""


class OverlaySubstrate(Substrate, Forking, PortableSnapshots, RecipeImages):
    name = "overlay"
    sandbox_class = OverlaySandbox
    capabilities = Capabilities(
        isolation=Isolation.NAMESPACES,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=True,
        network=False,
        notes=(
            "pid/mount/ipc/uts/net namespaces + overlayfs over a Debian rootfs, pivot_root; "
            "processes live between commands; O(1) snapshot/fork by stacking frozen upper layers; "
            "Freezable (cgroup v1 freezer) only where /sys/fs/cgroup/freezer is mounted and writable"
        ),
    )

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self.folder = run_folder(state_dir, run_id)
        self._server: ForkServer | None = None
        self._rootfs: str | None = None
        self._lock = threading.Lock()
        self._live: dict[str, OverlaySandbox] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self.images = LayeredImages(self.name, run_id, state_dir)  # task images (RecipeImages)
        self.trash = Trash(self.folder / "trash")
        self.freezer = FreezerCgroup.hierarchy() is not None

    def limit_mechanisms(self) -> dict[str, str]:
        from drumsbench.substrates.process import host_limit_mechanisms

        return host_limit_mechanisms(self.limits, self.freezer, "the sandbox's upper layer (everything it "
                                     "writes; a snapshot then copies the upper layer instead of renaming it)")

    def raw_floor(self) -> list[str] | None:
        """What a hand-written harness does for one overlay sandbox: fresh namespaces, an overlay
        of the Debian rootfs on a new upper layer, chroot, `true` (the layer goes with the namespace)."""
        return self._floor(str(images.ensure_rootfs()))

    def raw_floor_of(self, image: str) -> list[str] | None:
        """``raw_floor`` over a task image's layer folders (``create_from_image``'s lower layers)."""
        layout = self.images.known(image)
        return None if layout is None else self._floor(":".join(layout.layers))

    @staticmethod
    def _floor(lower: str) -> list[str]:
        # The layers live on a tmpfs over /mnt in the private mount namespace: they vanish with it.
        script = f'{FLOOR_MOUNT} && chroot "$d/m" /bin/true'
        return ["unshare", "--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "sh", "-c", script, "floor", lower]

    @classmethod
    def missing(cls) -> str | None:
        if os.geteuid() != 0:
            return "the overlay substrate needs root (mount and namespace creation)"
        try:
            with open("/proc/filesystems") as f:
                if "overlay" not in f.read():
                    return "the kernel has no overlayfs (modprobe overlay)"
        except OSError:
            return "cannot read /proc/filesystems"
        if shutil.which("nsenter") is None:
            return "nsenter is missing: apt-get install util-linux"
        if (why := entry.missing()) is not None:
            return why
        if not rootedfs.available():
            return "openat2(2) is unavailable: the overlay substrate needs Linux >= 5.6"
        if os.uname().machine not in ("x86_64", "aarch64"):
            return f"overlay: pivot_root known on x86_64/aarch64 only, not {os.uname().machine}"
        root = cached_rootfs()
        if root is None and shutil.which("debootstrap") is None:
            return "no Debian rootfs and no debootstrap to build it: apt-get install debootstrap"
        return None

    # -- run-level state -------------------------------------------------------------------------
    def server(self) -> ForkServer:
        with self._lock:
            if self._server is None or self._server.proc.poll() is not None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._server = ForkServer(self.run_id, self.folder)
            return self._server

    def _prepare(self) -> None:
        with self._lock:
            if self._rootfs is not None:
                return
            rootfs = mountable(os.path.realpath(images.ensure_rootfs()), "overlay")
            make_skeleton(self.folder / SKELETON)
            self._rootfs = rootfs

    def register_snapshot(self, snap: str, chain: tuple[str, ...], env: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._snapshots[snap] = _Snapshot(chain, dict(env or {}))

    def forget(self, box: OverlaySandbox) -> None:
        with self._lock:
            self._live.pop(box.id, None)

    def _new(self, base: tuple[str, ...], image_env: Mapping[str, str] | None = None,
             limits: SandboxLimits | None = None) -> OverlaySandbox:
        sid = new_sandbox_id()
        limits = limits or self.limits
        if not self.freezer:
            box = OverlaySandbox(self, sid, base, limits=limits)
        else:
            cgroup = FreezerCgroup.create(self.run_id, f"{self.name}-{sid}", limits=limits)
            try:
                box = FreezableOverlaySandbox(self, sid, base, cgroup, limits)
            except BaseException:
                cgroup.remove()
                raise
        box.image_env = dict(image_env or {})
        with self._lock:
            self._live[box.id] = box
        return box

    # -- interface -------------------------------------------------------------------------------
    def create(self) -> OverlaySandbox:
        self._prepare()
        assert self._rootfs is not None
        return self._new((SKELETON, self._rootfs))

    def fork(self, snapshot_id: str) -> OverlaySandbox:
        """A new sandbox whose start state is snapshot ``snapshot_id`` (no file copied)."""
        with self._lock:
            snap = self._snapshots.get(snapshot_id)
        if snap is None:
            raise SubstrateError(f"overlay: no snapshot {snapshot_id!r} in run {self.run_id}")
        return self._new(snap.chain, snap.env)

    def build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages.build_recipe``: the image is built by a container engine and run from that
        engine's own layer folders (``LayeredImages``: no copy, no export). ``SubstrateError`` for an
        image whose ``USER`` is not root (the overlay runs every command as uid 0) or whose engine
        keeps no overlay layers."""
        return self.images.build(recipe)

    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> OverlaySandbox:
        """``RecipeImages.create_from_image``: a sandbox whose lower layers are the skeleton over the
        image's own layer folders, every command given the image's ``ENV`` (a command's own
        environment over it)."""
        layout = self.images.layout(image)
        self._prepare()
        return self._new((SKELETON, *layout.layers), layout.env, limits)

    def snapshots(self) -> list[str]:
        with self._lock:
            return list(self._snapshots)

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Forget the snapshot; its layers stay while forks use them and go with the run's folder."""
        with self._lock:
            self._snapshots.pop(snapshot_id, None)

    def export_snapshot(self, snapshot_id: str) -> bytes:
        """The snapshot's own frozen layers (not the skeleton, not the rootfs, which every instance
        has) as one line of JSON naming them top first, then a GNU tar of them with owners,
        whiteouts and ``trusted.*`` xattrs (overlayfs's opaque directories)."""
        with self._lock:
            snap = self._snapshots.get(snapshot_id)
        if snap is None:
            raise SubstrateError(f"overlay: no snapshot {snapshot_id!r} in run {self.run_id}")
        chain = snap.chain
        self._prepare()
        if chain[-2:] != (SKELETON, self._rootfs):
            raise SubstrateError("overlay: a snapshot of a task image's sandbox is not portable (its image's "
                                 "layers are the builder's)")
        own = [c for c in chain if c != SKELETON and _LAYER.fullmatch(c)]
        proc = _tar(["-C", str(self.folder), "-cf", "-", "--", *own])
        return json.dumps({"layers": own}).encode() + b"\n" + proc

    def import_snapshot(self, data: bytes) -> str:
        """Unpack ``export_snapshot`` bytes into this run's layer store under new names; returns a
        snapshot id whose chain is those layers over this instance's skeleton and rootfs."""
        head, _, body = data.partition(b"\n")
        try:
            layers = json.loads(head)["layers"]
        except (ValueError, KeyError, TypeError) as e:
            raise SubstrateError(f"overlay: not an exported snapshot ({type(e).__name__})") from None
        if not isinstance(layers, list) or not all(isinstance(x, str) and _LAYER.fullmatch(x) for x in layers):
            raise SubstrateError("overlay: an exported snapshot names layers outside the layer store")
        self._prepare()
        assert self._rootfs is not None
        staging = self.folder / "layers" / f".import-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            _tar(["-C", str(staging), "-xf", "-"], stdin=body)
            mine = []
            for layer in layers:
                name = f"layers/{uuid.uuid4().hex[:12]}"
                os.rename(staging / layer, self.folder / name)
                mine.append(name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        snap = uuid.uuid4().hex[:12]
        self.register_snapshot(snap, (*mine, SKELETON, self._rootfs))
        return snap

    def close(self) -> None:
        """Destroy sandboxes still alive, stop the fork server, remove the run's layers."""
        with self._lock:
            live = list(self._live.values())
        for box in live:
            box.destroy()
        self.images.close()
        with self._lock:
            server, self._server = self._server, None
            self._snapshots.clear()
            self._rootfs = None
        if server is not None:
            server.stop()
        for cg in FreezerCgroup.of_run(self.run_id, f"{self.name}-"):
            cg.remove()
        self.trash.drain()
        if self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)

    def leftovers(self) -> list[str]:
        server = self._server
        own = server.pid if server is not None and server.proc.poll() is None else None
        left = [f"process {pid}" for pid in pids_with_env(RUN_VAR, self.run_id) if pid != own]
        left += [f"mount {m}" for m in host_mounts_below(self.folder)]
        left += cgroup_leftovers(self.run_id, f"{self.name}-")
        sandboxes = self.folder / "sb"
        if sandboxes.is_dir():
            left += [f"folder {p}" for p in sandboxes.iterdir()]
        if own is None and self.folder.exists():
            left.append(f"folder {self.folder}")
        return left

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        removed = FreezerCgroup.gc(dead_runs)  # thaws first: frozen tasks cannot die
        victims = {pid: run for pid, run in pids_with_env(RUN_VAR).items() if run in dead_runs}
        kill_pids(list(victims))
        removed += [f"process {pid} of run {run}" for pid, run in victims.items()]
        deadline = time.monotonic() + _KILL_WAIT_S
        while time.monotonic() < deadline and any(
            pid in victims for pid in pids_with_env(RUN_VAR)
        ):
            time.sleep(0.02)
        for run in dead_runs:
            folder = run_folder(state_dir, run)
            for point in sorted(host_mounts_below(folder), key=len, reverse=True):
                rc = _umount_detach(point)
                removed.append(f"mount {point}" + ("" if rc == 0 else f" (umount failed: {rc})"))
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(f"folder {folder}")
        return removed


_LAYER = re.compile(r"layers/[0-9a-f]{12}")
_TAR_FLAGS = ["--format=posix", "--xattrs", "--xattrs-include=trusted.*", "--numeric-owner"]


def _tar(args: list[str], stdin: bytes | None = None) -> bytes:
    """GNU tar with owners, device nodes (whiteouts) and ``trusted.*`` xattrs kept; its stdout."""
    import subprocess

    proc = subprocess.run(["tar", *_TAR_FLAGS, *args], input=stdin, capture_output=True)
    if proc.returncode != 0:
        raise SubstrateError(f"overlay: tar {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace')[-200:]}")
    return proc.stdout


def _move_layer(src: Path, dest: Path) -> None:
    """Rename ``src`` to ``dest`` (O(1)); across file systems (an upper layer on the sandbox's disk-bound
    tmpfs) copy it with ``cp -a`` (whiteouts, xattrs, owners kept) and remove the original."""
    try:
        os.rename(src, dest)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    import subprocess

    proc = subprocess.run(["cp", "-a", "--", str(src), str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        raise OSError(errno.EIO, f"cp -a {src} {dest}: {proc.stderr.strip()[-200:]}")
    shutil.rmtree(src, ignore_errors=True)


def _umount_detach(point: str) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(point), ctypes.c_int(2)) != 0:  # MNT_DETACH
        return ctypes.get_errno()
    return 0
