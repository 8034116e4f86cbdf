"""``process``: each sandbox is a folder on the host and commands are plain host processes.

It isolates **processes, not files or the network**. As root (the normal case), every sandbox
gets its own host uid/gid (``hostproc.UidLease``: ``2_000_000 + n``, no passwd entry, no
supplementary groups) and its commands run as that uid, so a command cannot signal, ptrace or stop
the harness or another sandbox's processes, and cannot read another sandbox's folders (work, home,
tmp and verify belong to the sandbox's uid, mode 0700; the sandbox's root folder stays root's, so
a command cannot delete the four folders). It can still read what any user can read on the host
and reach the network. HOME and TMPDIR point inside the sandbox.

Where the v1 freezer hierarchy is mounted (``/sys/fs/cgroup/freezer``) every sandbox also gets
its own freezer cgroup and every command is placed in it before its payload runs; the sandbox is
then ``Freezable`` (``FreezableProcessSandbox``), ``end_processes`` kills the cgroup's complete
task list and ``probe`` reads ``freezer.state``. Without it (or without root) the substrate
decides at construction not to offer ``Freezable``; processes are then tracked by session and by
the sandbox's label in their environment, as before.

The harness writes files as root through ``rootedfs`` (links made by a command resolve inside the
sandbox folder, never on the host) and hands them to the sandbox's uid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from drumsbench.core.canary_scan import scan_tokens
from drumsbench.core.errors import SubstrateError
from drumsbench.core.fingerprint import tree_digest
from drumsbench.core.host_places import shared_places
from drumsbench.substrates import own_view, rootedfs
from drumsbench.substrates.base import (
    SANDBOX_FOLDERS,
    Capabilities,
    ExecRequest,
    ExecResult,
    Helper,
    Helpers,
    HostFolders,
    HostLaunching,
    Isolation,
    LaunchView,
    ResetStrategy,
    SandboxLimits,
    SandboxPaths,
    Stream,
    Streaming,
    Substrate,
    ViewLaunching,
)
from drumsbench.substrates.exec_core import (
    EXEC_VAR,
    EndedStream,
    ProcessGroups,
    missing_workdir,
    sandbox_env,
    start_stream,
)
from drumsbench.substrates.host_helper import HostHelper
from drumsbench.substrates.hostproc import (
    CGROUP_PREFIX,
    FREEZER_ROOT,
    CgroupFreezable,
    FreezerCgroup,
    UidLease,
    cgroup_leftovers,
    host_probe,
    kill_pids,
    limit_hierarchies,
    mount_limited,
    mounts_below,
    pids_with_env,
    uid_separation_available,
    unmount_below,
)
from drumsbench.substrates.own_view import OwnView
from drumsbench.substrates.spawner import Spawner

RUN_VAR = HostLaunching.RUN_VAR
SANDBOX_VAR = HostLaunching.SANDBOX_VAR


# Sandbox folders of a state folder that a sandbox uid cannot traverse (the default state folder is
# below /root, mode 0700) live here instead, below the state folder's own path (so the path still
# names the state folder: ``SHARED_BASE/root/.local/state/drumsbench/<run>/<sandbox>``).
SHARED_BASE = Path("/var/lib/drumsbench/sandboxes")


def _traversable(path: Path) -> bool:
    """Every existing folder on the way to ``path`` can be searched by other users."""
    p = Path(os.path.realpath(path))
    for folder in (p, *p.parents):
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if not st.st_mode & stat.S_IXOTH:
            return False
    return True


def _shared_base(state_dir: Path) -> Path:
    return SHARED_BASE / os.path.realpath(state_dir).lstrip("/")


def _remove_empty_parents(folder: Path) -> None:
    """Remove ``folder``'s empty parents up to (not including) ``SHARED_BASE``."""
    p = folder.parent
    while SHARED_BASE in p.parents:
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


def sandbox_root(state_dir: Path, run_id: str) -> Path:
    """The run's sandbox folders: below the state folder, unless sandbox uids could not reach
    them there (then below ``SHARED_BASE``)."""
    if not uid_separation_available() or _traversable(state_dir):
        return state_dir / "sandboxes" / run_id
    return _shared_base(state_dir) / run_id


def _make_reachable(folder: Path) -> None:
    """Create ``folder`` and its missing parents root-owned, searchable by others (0755)."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        p = p.parent
    for m in reversed(missing):
        with contextlib.suppress(FileExistsError):
            m.mkdir(mode=0o755)
            os.chmod(m, 0o755)


def host_leftovers(run_id: str, folder: Path, cgroup_prefix: str | None = None) -> list[str]:
    """Host processes labelled with ``run_id``, sandbox folders still under ``folder``, and (for
    a substrate with ``cgroup_prefix``) the run's freezer cgroups and uid leases."""
    left = [f"process {pid}" for pid in pids_with_env(RUN_VAR, run_id)]
    left += [f"mount {m}" for m in mounts_below(folder)]
    if folder.is_dir():
        left += [f"folder {p}" for p in folder.iterdir()]
    if cgroup_prefix is not None:
        left += cgroup_leftovers(run_id, cgroup_prefix)
        left += [f"uid lease {p} of {run_id}" for p in UidLease.of_runs({run_id})
                 if os.readlink(p).split("/", 1)[-1].startswith(cgroup_prefix)]
    return left


def gc_host_runs(dead_runs: set[str], folder_of: Callable[[str], Path] | Sequence[Callable[[str], Path]]) -> list[str]:
    """Kill the labelled processes of ``dead_runs``, remove their freezer cgroups, uid leases and
    folders; one line per thing."""
    removed = FreezerCgroup.gc(dead_runs)  # thaws first: frozen tasks cannot die
    for pid, run in pids_with_env(RUN_VAR).items():
        if run in dead_runs:
            kill_pids([pid])
            removed.append(f"process {pid} of run {run}")
    for lease, run in UidLease.of_runs(dead_runs).items():
        with contextlib.suppress(ValueError):  # the lease's name is its uid
            removed += [f"{path} (left by a sandbox of run {run})" for path in remove_owned_by(int(lease.name))]
        with contextlib.suppress(OSError):
            lease.unlink()
            removed.append(f"uid lease {lease} of run {run}")
    folders = [folder_of] if callable(folder_of) else list(folder_of)
    for run in dead_runs:
        for of in folders:
            folder = of(run)
            removed += [f"mount {m}" for m in unmount_below(folder)]
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(f"folder {folder}")
    return removed


def host_limit_mechanisms(limits: SandboxLimits, cgroups: bool, disk_scope: str) -> dict[str, str]:
    """``Substrate.limit_mechanisms`` of the host-process substrates (process, bwrap): cgroup v1
    pids and memory groups beside the freezer group, a tmpfs of the disk bound's size."""
    if not cgroups:
        why = "not enforced: needs root and the cgroup v1 freezer, pids and memory hierarchies"
        return {"pids": why, "memory_mb": why, "disk_mb": why}
    ok = limit_hierarchies() is not None
    out = {}
    for field, what in (("pids", "pids.max of the sandbox's v1 pids cgroup"),
                        ("memory_mb", "memory.limit_in_bytes of the sandbox's v1 memory cgroup (OOM kill "
                                      "inside it)")):
        value = getattr(limits, field)
        out[field] = ("off (setting)" if value is None else
                      f"{value}: {what}" if ok else "not enforced: the v1 pids/memory hierarchies are missing")
    out["disk_mb"] = ("off (setting)" if limits.disk_bound_mb is None else
                      f"{limits.disk_bound_mb} MiB{limits.reserve_note()}: a tmpfs of that size on {disk_scope}; "
                      "ENOSPC inside it")
    return out


def new_sandbox_id() -> str:
    return uuid.uuid4().hex[:12]


# How often a sandbox starts its spawner again after it failed, before it starts commands the old way only.
_SPAWNER_STARTS = 3


class HostFolderSandbox(rootedfs.RootedFiles, HostFolders, Streaming):
    """A sandbox whose files live in a host folder: file methods act on the host directly
    (``rootedfs``; its in-sandbox paths are host paths: digest and scan walk them there).

    Subclasses choose how commands run (``_argv``) and how paths map (``host_path``).
    ``cgroup``: the sandbox's freezer group (every command joins it before its payload runs, or is
    born in it: ``spawns_inside``); ``lease``: the sandbox's own uid, which commands run as
    (``None``: the harness's); ``view``: the sandbox's own network and mount namespaces
    (``own_view``), which every command, stream, helper and the spawner start inside
    (``_inside``); launchers (``exec_launcher``, ``launch_view``) do not.
    """

    # Start the sandbox's own commands from a spawner inside its groups (``substrates/spawner.py``)
    # where it has both a cgroup and a uid of its own; else each command joins the groups itself.
    spawns_inside: ClassVar[bool] = False

    def __init__(
        self,
        substrate: str,
        run_id: str,
        sid: str,
        host_root: Path,
        paths: SandboxPaths,
        *,
        cgroup: FreezerCgroup | None = None,
        lease: UidLease | None = None,
        view: OwnView | None = None,
    ):
        self.substrate = substrate
        self.run_id = run_id
        self.id = sid
        self.host_root = host_root
        self.paths = paths
        self.groups = ProcessGroups()
        self._destroyed = False
        self.cgroup = cgroup
        self.lease = lease
        self.view = view
        self._fs = rootedfs.RootedFS(str(host_root))
        # kept helpers (``Helpers``) by pid: spared by ``kill_all``, stopped by ``destroy``
        self._helpers: dict[int, HostHelper] = {}
        # the spawner of the sandbox's commands (``spawns_inside``), started at the first command
        self._spawner: Spawner | None = None
        self._spawner_starts = 0
        self._spawner_starting = False
        self._spawner_lock = threading.Lock()
        self._make_folders()

    @property
    def uid(self) -> int | None:
        """The host uid the sandbox's commands run as (``None``: the harness's own)."""
        return None if self.lease is None else self.lease.uid

    def _make_folders(self) -> None:
        for sub in SANDBOX_FOLDERS:
            folder = self.host_root / sub
            folder.mkdir(parents=True, exist_ok=True)
            if self.lease is not None:
                os.chown(folder, self.lease.uid, self.lease.uid, follow_symlinks=False)
                os.chmod(folder, 0o700, follow_symlinks=False)

    # -- mapping -------------------------------------------------------------------------------
    def adopt_group(self, pgid: int) -> None:
        """Count a process group started outside ``exec`` (e.g. restored by CRIU) as the sandbox's own:
        ``destroy`` kills it with the rest."""
        self.groups.add(pgid)

    def host_path(self, path: str) -> Path:
        """Host path of an in-sandbox absolute path; refuses paths outside the sandbox."""
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        root = self.paths.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            raise SubstrateError(f"{path!r} is outside sandbox {self.id} ({root})")
        host = Path(os.path.normpath(self.host_root / os.path.relpath(path, root)))
        if host != self.host_root and self.host_root not in host.parents:
            raise SubstrateError(f"{path!r} escapes sandbox {self.id}")
        return host

    def _rel(self, path: str) -> str:
        """``path`` relative to the sandbox folder (for ``rootedfs``)."""
        rel = os.path.relpath(self.host_path(path), self.host_root)
        return "" if rel == "." else rel

    def _argv(self, argv: list[str], cwd: str, env: dict[str, str], *,
              stream: bool = False) -> tuple[list[str], str | None, dict[str, str]]:
        """(host argv, host cwd, host env) for an in-sandbox command (``stream``: one that outlives
        the harness thread that starts it: ``open_stream``)."""
        return argv, str(self.host_path(cwd)), env

    def _inside(self, argv: list[str], cwd: str | None, uid: int | None) -> tuple[list[str], int | None]:
        """(argv, uid to start it as): ``argv`` entering the sandbox's own view first, where it has
        one (then ``nsenter`` drops to ``uid`` after entering, and the command starts as root)."""
        if self.view is None:
            return argv, uid
        return [*self.view.prefix(cwd or str(self.host_root), uid), *argv], None

    # -- interface -----------------------------------------------------------------------------
    def _run(self, req: ExecRequest) -> ExecResult:
        return self._run_as(req, self.uid)

    def _host_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str] | None, *, launcher: bool = False,
                      pinned: Mapping[str, str] | None = None,
                      stream: bool = False) -> tuple[list[str], str | None, dict[str, str]] | None:
        """(host argv before the cgroup's wrap, host cwd, environment) of a command: through ``_argv``
        (the substrate's confinement), or with ``launcher`` as the host command it is (a harness-made
        launcher: ``HostLaunching``); ``None`` when its working folder is gone."""
        full = sandbox_env(self.paths, env, labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id}, pinned=pinned)
        host_argv, host_cwd, host_env = (list(argv), str(self.host_path(cwd)), full) if launcher \
            else self._argv(list(argv), cwd, full, stream=stream)
        if not self.host_root.is_dir():
            raise SubstrateError(f"sandbox {self.id}: its folder {self.host_root} is gone")
        if host_cwd is not None and not os.path.isdir(host_cwd):
            return None
        return host_argv, host_cwd, host_env

    def _run_as(self, req: ExecRequest, uid: int | None, launcher: bool = False) -> ExecResult:
        """Run ``req`` as ``uid`` (``_host_command``)."""
        command = self._host_command(req.argv, req.cwd, req.env, launcher=launcher)
        if command is None:
            return missing_workdir(req.cwd)
        host_argv, host_cwd, host_env = command
        spawner = None if launcher or uid is None or uid != self.uid else self._live_spawner()
        plain = host_argv
        if self.cgroup is not None:
            host_argv = self.cgroup.wrap(host_argv)
        if not launcher:
            host_argv, uid = self._inside(host_argv, host_cwd, uid)
        return self.groups.run(host_argv, req, cwd=host_cwd, env=host_env, uid=uid, spawner=spawner,
                               spawn_argv=plain)

    def open_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Stream:
        """``Streaming``: as ``exec`` runs a command (``_argv``'s confinement, the sandbox's uid, its
        cgroups, its labels), never through the spawner; in a session of its own, counted in the
        sandbox's process groups and marked with a token, which ``close`` kills."""
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        token = uuid.uuid4().hex
        command = self._host_command(argv, cwd or self.paths.work, env, pinned={EXEC_VAR: token}, stream=True)
        if command is None:
            return EndedStream(126)
        host_argv, host_cwd, host_env = command
        if self.cgroup is not None:
            host_argv = self.cgroup.wrap(host_argv)
        host_argv, uid = self._inside(host_argv, host_cwd, self.uid)
        return start_stream(host_argv, cwd=host_cwd, env=host_env, uid=uid, groups=self.groups, token=token)

    def _live_spawner(self) -> Spawner | None:
        """The sandbox's spawner; the first call starts it in the background (it is ready a few
        tens of ms later: a sandbox's first command never waits for it). Until it is ready, and
        after it failed ``_SPAWNER_STARTS`` times, commands start the old way (``None`` or a spawner
        that declines)."""
        if not self.spawns_inside or self.cgroup is None or self.lease is None or self._destroyed:
            return None
        spawner = self._spawner
        if spawner is not None and not spawner.failed:
            return spawner
        with self._spawner_lock:
            if self._spawner_starting or self._spawner_starts >= _SPAWNER_STARTS:
                return None
            self._spawner_starting = True
        threading.Thread(target=self._start_spawner, name=f"spawner-{self.id}", daemon=True).start()
        return None

    def _start_spawner(self) -> None:
        assert self.cgroup is not None and self.lease is not None
        old = self._spawner
        if old is not None:
            old.stop()
        env = sandbox_env(self.paths, None, labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id})
        cgroup = self.cgroup

        def place(argv: list[str]) -> list[str]:
            return self._inside(cgroup.wrap(argv), str(self.host_root), None)[0]

        try:
            spawner: Spawner | None = Spawner.start(place, self.lease.uid, str(self.host_root), env)
        except OSError:
            spawner = None
        with self._spawner_lock:
            self._spawner_starts += 1
            self._spawner_starting = False
            if not self._destroyed:
                self._spawner = spawner
                return
        if spawner is not None:  # destroyed meanwhile: ``destroy`` did not see it
            spawner.stop()

    def _rooted(self) -> rootedfs.RootedFS:
        return self._fs

    def _file_owner(self) -> tuple[int, int] | None:
        return None if self.lease is None else (self.lease.uid, self.lease.uid)

    def _read_failed(self, path: str, e: OSError) -> Exception:
        if e.errno == errno.ENOTDIR:
            return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return super()._read_failed(path, e)

    def tree_digest(self, path: str) -> str:
        return tree_digest(str(self.host_path(path)))

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        return scan_tokens([str(self.host_path(f)) for f in folders], list(tokens))

    def kill_all(self) -> None:
        """Kill every process this sandbox started, including ones that left their session: the
        cgroup's task list (complete), the process groups of commands, labelled processes. The
        harness's kept helpers (``Helpers``) and its spawner are spared, by pid (which stays theirs
        until the harness reaps them, after they are taken off the list); what they started is not.

        A frozen cgroup's tasks die only when thawed; this does not thaw (``destroy`` does)."""
        spawner = self._spawner
        spare = frozenset(self._helpers) | frozenset(() if spawner is None or spawner.failed else (spawner.pid,))
        if self.cgroup is not None:
            self.cgroup.kill(spare=spare)
        self.groups.kill()
        kill_pids([pid for pid in pids_with_env(SANDBOX_VAR, self.id) if pid not in spare])
        if self.cgroup is not None and self.cgroup.state() == "THAWED":
            self.cgroup.kill(wait=1.0, spare=spare)  # what forked while the first pass ran

    def _helper_ended(self, pid: int) -> None:
        self._helpers.pop(pid, None)

    def stop_helpers(self) -> None:
        """Stop the kept helpers and the spawner (``destroy``)."""
        for helper in list(self._helpers.values()):
            helper.stop()
        with self._spawner_lock:
            spawner = self._spawner
        if spawner is not None:
            spawner.stop()

    def end_processes(self) -> None:
        if self._destroyed:
            return
        self.kill_all()

    def probe(self, timeout: float = 5.0) -> str | None:
        return host_probe(self.id, self._destroyed, self.cgroup, lambda: None if self.host_root.is_dir()
                          else f"the sandbox's folder {self.host_root} is gone")

    def _thaw_for_kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.thaw_for_kill()

    def reset_in_place(self) -> None:
        self._thaw_for_kill()
        self.kill_all()
        for sub in SANDBOX_FOLDERS:
            shutil.rmtree(self.host_root / sub, ignore_errors=True)
        try:
            self._make_folders()
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot recreate its folders: {e}") from e

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        with contextlib.suppress(SubstrateError):
            self._thaw_for_kill()
        self.stop_helpers()
        self.kill_all()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.view is not None:
            self.view.close()
        unmount_below(self.host_root)  # the disk bound's tmpfs, with everything written into it
        shutil.rmtree(self.host_root, ignore_errors=True)
        if self.lease is not None:
            remove_owned_by(self.lease.uid)
            self.lease.release()


def remove_owned_by(uid: int, places: Sequence[str] | None = None) -> list[str]:
    """Remove the entries directly in ``places`` (default: every one of the host's shared places,
    ``host_places.shared_places``) owned by ``uid`` (a sandbox's own uid: nothing else owns files
    with it); returns what was removed."""
    removed = []
    for place in shared_places() if places is None else places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                continue
    return removed


class ProcessSandbox(HostFolderSandbox, HostLaunching, ViewLaunching, Helpers):
    """In-sandbox paths are the host paths."""

    spawns_inside = True

    @property
    def helper_uid(self) -> int:
        if self.lease is None:
            raise SubstrateError(f"sandbox {self.id}: its commands run as the harness's own uid")
        return self.lease.uid

    def start_helper(self, argv: Sequence[str], *, cwd: str, pass_fds: Sequence[int] = ()) -> Helper:
        """``Helpers.start_helper``: as root, in the sandbox's cgroups (placed before it runs),
        labelled, in its own session, ``oom_score_adj`` -1000 (the policy's memory hog in the same
        memory group is killed before it; a helper lowers it again for what it runs as the
        sandbox's uid). Refused where the sandbox's commands run as the harness's own uid: there a
        helper would be in the policy's reach."""
        self.helper_uid  # noqa: B018 - refuses without a uid of the sandbox's own
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        env = sandbox_env(self.paths, None, labels={RUN_VAR: self.run_id, SANDBOX_VAR: self.id})
        host_cwd = str(self.host_path(cwd))
        host_argv = list(argv) if self.cgroup is None else self.cgroup.wrap(list(argv))
        host_argv, _ = self._inside(host_argv, host_cwd, None)
        try:
            proc = subprocess.Popen(host_argv, cwd=host_cwd, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=tuple(pass_fds))
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot start a helper {argv[0]!r}: {e}") from e
        with contextlib.suppress(OSError):
            Path(f"/proc/{proc.pid}/oom_score_adj").write_text("-1000")
        helper = HostHelper(proc, self._helper_ended)
        self._helpers[proc.pid] = helper
        return helper

    def empty_folder(self, path: str, timeout: float = 30.0) -> None:
        """From the host, without a command: the sandbox's files are the host's. Entries are
        removed, links never followed (``shutil.rmtree`` works on descriptors). Called only when
        nothing of the sandbox runs (after ``end_processes``)."""
        folder = self.host_path(path)
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot list {path}: {e}") from e
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def launch_view(self) -> LaunchView:
        """``unshare`` from the sandbox's own view (where it has one: the host's system, the answer
        keys and the non-system folders covered; else the host's file system as it is): new
        namespaces, no file confined beyond the view. Shell commands drop to the sandbox's uid."""
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        unshare = ["unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "--mount", "--mount-proc",
                   "--propagation", "private", "--"]
        # in the sandbox's cgroups (its memory, pids and freezer groups count and stop the tree)
        placed = self.cgroup.wrap(unshare) if self.cgroup is not None else unshare
        prefix = tuple(self._inside(placed, str(self.host_root), None)[0])
        app_ids = None
        if self.lease is not None:
            # the tree's applications run as the sandbox's second uid with its gid: its folders
            # become group-writable for them (no other uid has that gid)
            app_ids = (self.lease.app_uid, self.lease.uid)
            for sub in ("work", "home", "tmp"):
                os.chmod(self.host_root / sub, 0o770, follow_symlinks=False)
        return LaunchView(prefix, self.host_root, str(self.host_root), app_ids=app_ids)

    def exec_launcher(self, argv: Sequence[str], **options: Any) -> ExecResult:
        """Run a *harness-made* launcher as root (the harness's uid), not as the sandbox's uid.

        For environments that build their own isolation around the sandbox and need privileges
        to enter it (the desktop's ``nsenter`` into its namespaces). Never for a policy's
        command line as such: whatever it runs has the harness's privileges unless the launcher
        drops them. It is otherwise an ordinary command of the sandbox: in its cgroup, labelled,
        bounded, killed on timeout and by ``end_processes``/``destroy``. ``options``: those of
        ``exec``."""
        cwd = options.pop("cwd", None) or self.paths.work
        return self._run_as(ExecRequest(list(argv), cwd=cwd, **options), uid=None, launcher=True)


class FreezableProcessSandbox(CgroupFreezable, ProcessSandbox):
    """A process sandbox with a freezer cgroup: the host can freeze it (fault injection)."""


class ProcessSubstrate(Substrate):
    name = "process"
    sandbox_class = ProcessSandbox
    capabilities = Capabilities(
        isolation=Isolation.NONE,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        network=False,
        notes=(
            "plain host processes: as root each sandbox runs as its own uid (processes of the "
            "harness and other sandboxes out of reach, sandbox folders private) in its own network "
            "namespace (lo only) and mount view (the host's files, answer keys covered: own_view); "
            "without root, host files and the network are shared; Freezable (cgroup v1 freezer, "
            "per-sandbox group) only where /sys/fs/cgroup/freezer is mounted and writable, decided "
            "at construction"
        ),
    )
    # False: sandboxes share the host's network and files (a control for the answer-key and
    # loopback tests, never a user's choice)
    make_views: ClassVar[bool] = True

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self.separate_uids = uid_separation_available()
        self.freezer = FreezerCgroup.hierarchy() is not None
        self.views = self.make_views and self.separate_uids and own_view.available() is None
        if not self.views:
            self.capabilities = self.capabilities.model_copy(update={"network": True})

    @classmethod
    def missing(cls) -> str | None:
        return None

    def answer_keys_exposed(self) -> str | None:
        if self.views:
            return None
        if not self.separate_uids:
            return "without root its commands run as your own uid, on the host's files"
        return f"its sandboxes have no own view here ({own_view.available() or 'turned off'})"

    def limit_mechanisms(self) -> dict[str, str]:
        return host_limit_mechanisms(self.limits, self.freezer, "the sandbox folder (its work, home, tmp and "
                                     "verify; host places such as /tmp are shared and not bounded)")

    def create(self) -> ProcessSandbox:
        sid = new_sandbox_id()
        root = sandbox_root(self.state_dir, self.run_id) / sid
        lease: UidLease | None = None
        cgroup: FreezerCgroup | None = None
        view: OwnView | None = None
        try:
            _make_reachable(root.parent)
            root.mkdir(mode=0o755)
            if self.limits.disk_bound_mb is not None and self.freezer:
                mount_limited(root, self.limits.disk_bound_mb)
            if self.separate_uids:
                lease = UidLease.acquire(self.run_id, f"{self.name}-{sid}", root)
            if self.freezer:
                cgroup = FreezerCgroup.create(self.run_id, f"{self.name}-{sid}",
                                              owner=None if lease is None else lease.uid, limits=self.limits)
            paths = SandboxPaths.under(str(root))
            if self.views:
                view = OwnView.create(self.hidden, root)
            cls = FreezableProcessSandbox if cgroup is not None else ProcessSandbox
            return cls(self.name, self.run_id, sid, root, paths, cgroup=cgroup, lease=lease, view=view)
        except (OSError, SubstrateError) as e:
            if view is not None:
                view.close()
            if cgroup is not None:
                cgroup.remove()
            if lease is not None:
                lease.release()
            unmount_below(root)
            shutil.rmtree(root, ignore_errors=True)
            if isinstance(e, SubstrateError):
                raise
            raise SubstrateError(f"process: cannot create sandbox folder {root}: {e}") from e

    def close(self) -> None:
        """The run is over: nothing of it may remain, even what a sandbox lost track of."""
        for cg in FreezerCgroup.of_run(self.run_id, f"{self.name}-"):
            cg.remove()
        kill_pids(list(pids_with_env(RUN_VAR, self.run_id)))
        for lease in UidLease.of_runs({self.run_id}):
            with contextlib.suppress(OSError):
                if os.readlink(lease).split("/", 1)[-1].startswith(f"{self.name}-"):
                    lease.unlink()
        folder = sandbox_root(self.state_dir, self.run_id)
        unmount_below(folder)
        shutil.rmtree(folder, ignore_errors=True)
        _remove_empty_parents(folder)

    def raw_floor(self) -> list[str] | None:
        return ["true"]

    def leftovers(self) -> list[str]:
        return host_leftovers(self.run_id, sandbox_root(self.state_dir, self.run_id), f"{self.name}-")

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        removed = gc_host_runs(dead_runs, [lambda run: state_dir / "sandboxes" / run,
                                           lambda run: _shared_base(state_dir) / run])
        return removed + sweep_orphans(cls.name)


def _mirrored_state(folder: Path) -> Path | None:
    """The state folder a sandbox folder below ``SHARED_BASE`` stands for
    (``SHARED_BASE/<state path>/<run>/<sandbox>``), or None for a folder elsewhere."""
    if SHARED_BASE not in folder.parents or len(folder.relative_to(SHARED_BASE).parts) < 3:
        return None
    return Path("/", *folder.relative_to(SHARED_BASE).parts[:-2])


def sweep_orphans(substrate: str = "process") -> list[str]:
    """Machine-wide: uid leases whose sandbox folder is gone — or lies below ``SHARED_BASE`` for a
    state folder that is gone, with no process of its run left (the folder, its mounts, the lease
    go) — and ``substrate``'s freezer cgroups
    without a lease for over a minute (leases are taken before and released after the cgroup), e.g. of runs whose
    state folder vanished without a ``gc``. One line per thing removed."""
    removed = []
    live: set[tuple[str, str]] = set()
    labelled = set(pids_with_env(RUN_VAR).values())
    for path, (run, label, folder) in UidLease.entries().items():
        state = _mirrored_state(Path(folder))
        if os.path.isdir(folder) and (state is None or state.exists() or run in labelled):
            live.add((run, label))
            continue
        if os.path.isdir(folder):  # below the shared base, its state folder gone, nothing of it runs
            removed += [f"mount {m}" for m in unmount_below(Path(folder))]
            shutil.rmtree(folder, ignore_errors=True)
            _remove_empty_parents(Path(folder))
            removed.append(f"folder {folder} (its state folder {state} is gone)")
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(f"uid lease {path} ({folder} is gone)")
    try:
        runs = [p.name for p in (FREEZER_ROOT / CGROUP_PREFIX).iterdir() if p.is_dir()]
    except OSError:
        runs = []
    for run in runs:
        for cg in FreezerCgroup.of_run(run, f"{substrate}-"):
            try:
                age = time.time() - cg.path.stat().st_mtime
            except OSError:
                continue
            # a sandbox being created takes its lease first; a minute's margin covers the gap
            if (run, cg.path.name) not in live and age > 60:
                cg.remove()
                removed.append(f"cgroup {cg.path} (no sandbox)")
        with contextlib.suppress(OSError):
            FreezerCgroup.run_dir(run).rmdir()
    return removed
