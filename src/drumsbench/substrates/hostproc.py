"""Host-side machinery of the substrates whose sandboxes are host processes (process, bwrap,
overlay): finding and killing labelled processes, per-sandbox uids, freezer cgroups with their
pids and memory limit groups, and size-limited tmpfs folders (``LimitedFolder``).

Running one command (timeout, bounded output, killing its tree) is ``exec_core``'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import select
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import APP_UID_OFFSET, Freezable, SandboxLimits, sh_quote


def pids_with_env(var: str, value: str | None = None) -> dict[int, str]:
    """Host pids whose environment sets ``var`` (to ``value`` when given): pid -> value."""
    found: dict[int, str] = {}
    needle = var.encode() + b"="
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        for item in data.split(b"\0"):
            if item.startswith(needle):
                v = item[len(needle):].decode(errors="replace")
                if value is None or v == value:
                    found[int(entry)] = v
                break
    return found


def kill_pids(pids: Sequence[int], wait_s: float = 5.0) -> None:
    """SIGKILL ``pids`` and wait (at most ``wait_s``) until none of them still has its memory:
    a killed process takes a while to go on a loaded host, and callers check right after.

    Each is signalled and awaited through a pidfd (readable once the process has exited: no pid
    reuse, no polling interval; a 20-ms poll made every verification of the judge wait 20 ms for
    its killed server); a pid whose pidfd cannot be opened but that still exists is polled."""
    fds: list[int] = []
    polled: list[int] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                continue  # gone already
            fd = -1
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd >= 0:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        if fd >= 0:
            fds.append(fd)
        else:
            polled.append(pid)
    deadline = time.monotonic() + wait_s
    waiter = select.poll()
    for fd in fds:
        waiter.register(fd, select.POLLIN)
    left = set(fds)
    try:
        while (left or polled) and (now := time.monotonic()) < deadline:
            wait_ms = max(1, int((deadline - now) * 1000)) if not polled else 5
            for fd, _event in waiter.poll(wait_ms):
                waiter.unregister(fd)
                left.discard(fd)
            polled = [p for p in polled if _has_memory(p)]
    finally:
        for fd in fds:
            os.close(fd)


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/PID/stat`` (state, ppid, ..., flags at index 6; proc(5)), or None when
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields or None


def _has_memory(pid: int) -> bool:
    """Alive and not yet a zombie (a zombie has no environment left to match a label)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit


def alive_not_exiting(pid: int) -> bool:
    """Is ``pid`` a live process: not gone, not a zombie, and not exiting (``PF_EXITING``)? A pid
    namespace's init that was killed stays in ``do_exit`` until every other process of the
    namespace is gone, so the execs of a killed container end before its init does."""
    fields = stat_fields(pid) if pid > 0 else None
    return fields is not None and fields[0] not in ("Z", "X") and not int(fields[6]) & PF_EXITING


# -- per-sandbox identities and freezer cgroups (process, bwrap, overlay) ------------------------

FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")
# v1 hierarchies of the limit groups: controller -> mount point
LIMIT_ROOTS = {"pids": Path("/sys/fs/cgroup/pids"), "memory": Path("/sys/fs/cgroup/memory")}
# the v1 cpu hierarchy: a group there only for a sandbox with a CPU bound (``SandboxLimits.cpus``)
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPU_PERIOD_US = 100_000
CGROUP_PREFIX = "drumsbench"
UID_BASE = 2_000_000
UID_SPAN = 1_000_000
UID_LEASES = Path("/run/drumsbench/uids")
# A sandbox's second uid, for the applications an environment launches in it (the desktop's
# LibreOffice): its lease's uid + APP_UID_OFFSET (in [3_000_000, 4_000_000), never a lease's own)
# (base.APP_UID_OFFSET = UID_SPAN: never a lease's own uid)
# The applications' uid (and gid) in a sandbox whose own namespaces and file view are all that set
# it apart (bwrap, overlay): one for all such sandboxes (none sees another's files or processes),
# never a lease's uid nor a second uid, never root
VIEW_APP_UID = UID_BASE + 2 * UID_SPAN


def give_folders(host_root: Path, uid: int) -> tuple[int, int]:
    """The sandbox's work, home and tmp folders (below ``host_root`` as the harness reaches it)
    become ``uid``'s, with that gid, so the applications a view launches as that uid write there
    (``LaunchView.app_ids``); returns the (uid, gid)."""
    for sub in ("work", "home", "tmp"):
        folder = host_root / sub
        if folder.is_dir() and not folder.is_symlink():
            os.chown(folder, uid, uid, follow_symlinks=False)
    return uid, uid
# How long destroy/reset wait for a cgroup's tasks to go after SIGKILL (thawed first).
_CGROUP_KILL_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class UidLease:
    """A host uid (and gid of the same number) owned by one sandbox while it lives.

    Leases are symlinks ``UID_LEASES/<uid> -> <run>/<sandbox><host folder>`` made with
    ``symlink(2)`` (atomic, fails when taken), so concurrent runs on one machine never share an
    identity; ``gc`` removes the leases of dead runs and those whose folder is gone (a run whose
    state folder vanished without a ``gc``). No ``/etc/passwd`` entry is needed.
    """

    uid: int
    run_id: str
    sandbox_id: str

    @property
    def path(self) -> Path:
        return UID_LEASES / str(self.uid)

    @property
    def app_uid(self) -> int:
        """The sandbox's second uid (``APP_UID_OFFSET``): as exclusive as the lease itself."""
        return self.uid + APP_UID_OFFSET

    @classmethod
    def acquire(cls, run_id: str, sandbox_id: str, folder: Path) -> UidLease:
        UID_LEASES.mkdir(parents=True, exist_ok=True)
        start = secrets.randbelow(UID_SPAN)
        for i in range(UID_SPAN):
            uid = UID_BASE + (start + i) % UID_SPAN
            try:
                os.symlink(f"{run_id}/{sandbox_id}{os.path.abspath(folder)}", UID_LEASES / str(uid))
            except FileExistsError:
                continue
            except OSError as e:
                raise SubstrateError(f"cannot lease a sandbox uid in {UID_LEASES}: {e}") from e
            return cls(uid, run_id, sandbox_id)
        raise SubstrateError(f"no free sandbox uid in [{UID_BASE}, {UID_BASE + UID_SPAN})")

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @staticmethod
    def entries() -> dict[Path, tuple[str, str, str]]:
        """Every lease: path -> (run id, sandbox label, host folder)."""
        found: dict[Path, tuple[str, str, str]] = {}
        try:
            paths = list(UID_LEASES.iterdir())
        except OSError:
            return found
        for p in paths:
            try:
                parts = os.readlink(p).split("/", 2)
            except OSError:
                continue
            if len(parts) == 3:
                found[p] = (parts[0], parts[1], "/" + parts[2])
        return found

    @staticmethod
    def of_runs(runs: set[str] | None) -> dict[Path, str]:
        """Lease files of ``runs`` (all when ``None``): path -> run id."""
        found: dict[Path, str] = {}
        try:
            entries = list(UID_LEASES.iterdir())
        except OSError:
            return found
        for p in entries:
            try:
                run = os.readlink(p).split("/", 1)[0]
            except OSError:
                continue
            if runs is None or run in runs:
                found[p] = run
        return found


def _v1_mounted(root: Path, controller: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return False
    return any(len(m) >= 4 and m[2] == "cgroup" and m[1] == str(root) and controller in m[3].split(",")
               for m in mounts) and os.access(root, os.W_OK)


def own_cgroup(controller: str) -> str:
    """This process's group in the v1 ``controller`` hierarchy ("/" when unknown)."""
    try:
        with open("/proc/self/cgroup") as f:
            for ln in f:
                parts = ln.rstrip("\n").split(":", 2)
                if len(parts) == 3 and controller in parts[1].split(","):
                    return parts[2] or "/"
    except OSError:
        pass
    return "/"


def limit_hierarchies() -> dict[str, Path] | None:
    """Where limit groups go: controller -> the parent of ``drumsbench/<run>/...``, i.e. this
    process's own group in each v1 hierarchy (the sandboxes stay inside whatever bounds the
    harness itself); ``None`` without root or without both the pids and memory hierarchies."""
    if os.geteuid() != 0:
        return None
    found = {}
    for ctl, root in LIMIT_ROOTS.items():
        if not _v1_mounted(root, ctl):
            return None
        found[ctl] = root / own_cgroup(ctl).lstrip("/")
    return found


def _limit_run_dirs(run_id: str) -> list[Path]:
    """Every ``.../drumsbench/<run_id>`` limit folder (any harness's parent group, up to 3 deep)."""
    found: list[Path] = []
    for root in (*LIMIT_ROOTS.values(), CPU_ROOT):
        for depth in range(4):
            try:  # groups come and go while the glob walks (another run's sandbox ending): a race, not an error
                found += [p for p in root.glob("/".join(["*"] * depth + [CGROUP_PREFIX, run_id])) if p.is_dir()]
            except FileNotFoundError:
                continue
    return found


def uid_separation_available() -> bool:
    """Per-sandbox uids need root (setuid, chown)."""
    return os.geteuid() == 0


class FreezerCgroup:
    """A cgroup v1 freezer group ``FREEZER_ROOT/drumsbench/<run>/<name>`` holding one sandbox.

    Every command is placed in it by a root-run wrapper before its payload runs (``wrap``), so
    ``procs()`` is the complete list of the sandbox's processes, whatever sessions or groups they
    left. ``state()`` only reads ``freezer.state`` (the gate's evidence); ``write_state`` is the
    injector's (``Freezable``) and destroy's path.
    """

    def __init__(self, path: Path, limit_dirs: Sequence[Path] = ()) -> None:
        self.path = path
        # the sandbox's pids and memory groups (same name, in those hierarchies); every process
        # placed in the freezer group is placed in them too
        self.limit_dirs = list(limit_dirs)

    @staticmethod
    def hierarchy() -> Path | None:
        """The v1 freezer hierarchy when it is mounted and writable by this process, else ``None``."""
        if os.geteuid() != 0:
            return None
        try:
            with open("/proc/self/mounts") as f:
                mounts = [ln.split() for ln in f]
        except OSError:
            return None
        for m in mounts:
            if len(m) >= 4 and m[2] == "cgroup" and m[1] == str(FREEZER_ROOT) and "freezer" in m[3].split(","):
                return FREEZER_ROOT if os.access(FREEZER_ROOT, os.W_OK) else None
        return None

    @staticmethod
    def run_dir(run_id: str) -> Path:
        return FREEZER_ROOT / CGROUP_PREFIX / run_id

    @classmethod
    def create(cls, run_id: str, name: str, owner: int | None = None,
               limits: SandboxLimits | None = None) -> FreezerCgroup:
        """A new group; ``owner`` (a sandbox uid) may write its ``cgroup.procs``, so a command
        already running as that uid can place itself (never another sandbox's, never out of it).

        With ``limits`` whose pids or memory bound is on, the group of the same name is made in the
        v1 pids and memory hierarchies (below the harness's own group, ``limit_hierarchies``) with
        ``pids.max`` and ``memory.limit_in_bytes``; with a CPU bound, in the v1 cpu hierarchy too,
        with ``cpu.cfs_quota_us`` = that many CPUs' time per ``CPU_PERIOD_US``; ``SubstrateError``
        when a hierarchy it needs is missing."""
        path = cls.run_dir(run_id) / name
        made: list[Path] = []
        try:
            path.mkdir(parents=True)
            made.append(path)
            if limits is not None and (limits.pids is not None or limits.memory_mb is not None):
                parents = limit_hierarchies()
                if parents is None:
                    raise OSError("the v1 pids and memory cgroup hierarchies are not mounted and writable")
                for ctl, parent in parents.items():
                    d = parent / CGROUP_PREFIX / run_id / name
                    d.mkdir(parents=True)
                    made.append(d)
                    if ctl == "pids" and limits.pids is not None:
                        (d / "pids.max").write_text(str(limits.pids))
                    if ctl == "memory" and limits.memory_mb is not None:
                        (d / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
            if limits is not None and limits.cpus is not None:
                if os.geteuid() != 0 or not _v1_mounted(CPU_ROOT, "cpu"):
                    raise OSError(f"the v1 cpu cgroup hierarchy is not mounted and writable at {CPU_ROOT}")
                d = CPU_ROOT / own_cgroup("cpu").lstrip("/") / CGROUP_PREFIX / run_id / name
                d.mkdir(parents=True)
                made.append(d)
                (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(max(1000, round(limits.cpus * CPU_PERIOD_US))))
            for d in made:
                if owner is not None:
                    os.chown(d / "cgroup.procs", owner, owner)
        except OSError as e:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise SubstrateError(f"cannot create the sandbox's cgroups {path}: {e}") from e
        return cls(path, made[1:])

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    @property
    def procs_files(self) -> list[str]:
        """The freezer group's ``cgroup.procs`` and its limit groups'."""
        return [self.procs_file, *(str(d / "cgroup.procs") for d in self.limit_dirs)]

    def place(self, pid: int) -> None:
        """Put ``pid`` in the group and its limit groups (``OSError`` when it cannot)."""
        for procs in self.procs_files:
            with open(procs, "w") as f:
                f.write(str(pid))

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed so that its process joins this group (and its limit groups) before the
        payload starts."""
        place = " && ".join(f"echo $$ > {sh_quote([p])}" for p in self.procs_files)
        if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
            # the command's own shell places itself: one exec fewer, the same $0 and $$
            return ["/bin/sh", "-c", f"{{ {place}; }} || exit 125\n{argv[2]}"]
        return ["/bin/sh", "-c", f'{{ {place}; }} || exit 125; exec "$@"', "sh", *argv]

    def limit_state(self) -> dict[str, str]:
        """What the limit groups say now (read only): pids.current/max, memory usage/limit/failcnt."""
        out: dict[str, str] = {}
        for d in self.limit_dirs:
            for name in ("pids.current", "pids.max", "memory.max_usage_in_bytes", "memory.limit_in_bytes",
                         "memory.failcnt"):
                with contextlib.suppress(OSError):
                    out[name] = (d / name).read_text().strip()
        return out

    def exists(self) -> bool:
        return self.path.is_dir()

    def state(self) -> str | None:
        """``freezer.state`` (THAWED, FREEZING, FROZEN), ``None`` when the group is gone. Read only."""
        try:
            return (self.path / "freezer.state").read_text().strip()
        except OSError:
            return None

    def evidence(self) -> str | None:
        """What the group's state says against the sandbox (gone, frozen by the host), or None."""
        state = self.state()
        if state is None:
            return f"the sandbox's freezer cgroup {self.path} is gone"
        if state in ("FROZEN", "FREEZING"):
            return f"the host froze the sandbox (freezer.state {state})"
        return None

    def write_state(self, state: str) -> None:
        try:
            (self.path / "freezer.state").write_text(state)
        except OSError as e:
            raise SubstrateError(f"cannot set {self.path} to {state}: {e}") from e

    def thaw_for_kill(self) -> None:
        """Thaw a frozen or freezing group: its tasks die only once thawed."""
        if self.state() not in (None, "THAWED"):
            self.write_state("THAWED")

    def procs(self) -> list[int]:
        try:
            with open(self.procs_file) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def kill(self, wait: float = 0.0, spare: frozenset[int] = frozenset()) -> bool:
        """SIGKILL every task but ``spare``, again until none is left or ``wait`` seconds passed;
        True when empty (but ``spare``).

        Under the v1 freezer a frozen task dies only once thawed: callers that need the group
        empty thaw first."""
        deadline = time.monotonic() + wait
        while True:
            pids = [pid for pid in self.procs() if pid not in spare]
            if not pids:
                return True
            kill_pids(pids)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def remove(self) -> list[str]:
        """Thaw, kill, remove the group (and the run's folder when empty); problems, one line each."""
        if not self.exists():
            return []
        problems = []
        with contextlib.suppress(SubstrateError):
            self.write_state("THAWED")
        deadline = time.monotonic() + _CGROUP_KILL_WAIT_S
        while True:
            if not self.kill(wait=max(0.0, deadline - time.monotonic())):
                problems.append(f"cgroup {self.path}: tasks {self.procs()} do not die")
                break
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                # a command's wrapper joined between the kill and the rmdir (EBUSY): again
                if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                    problems.append(f"cgroup {self.path}: {e}")
                    break
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
        problems += _remove_limit_dirs(self.limit_dirs)
        return problems

    @classmethod
    def of_run(cls, run_id: str, prefix: str = "") -> list[FreezerCgroup]:
        """The run's groups, each with its limit groups."""
        limits: dict[str, list[Path]] = {}
        for run_dir in _limit_run_dirs(run_id):
            with contextlib.suppress(OSError):
                for d in run_dir.iterdir():
                    if d.is_dir():
                        limits.setdefault(d.name, []).append(d)
        folder = cls.run_dir(run_id)
        try:
            return [cls(p, limits.get(p.name, ())) for p in sorted(folder.iterdir())
                    if p.is_dir() and p.name.startswith(prefix)]
        except OSError:
            return []

    @staticmethod
    def limit_leftovers(run_id: str, prefix: str = "") -> list[Path]:
        """Limit groups of ``run_id`` whose name starts with ``prefix`` (whatever their freezer group)."""
        found = []
        for run_dir in _limit_run_dirs(run_id):
            with contextlib.suppress(OSError):
                found += [d for d in run_dir.iterdir() if d.is_dir() and d.name.startswith(prefix)]
        return found

    @classmethod
    def gc(cls, dead_runs: set[str]) -> list[str]:
        """Remove the groups of ``dead_runs`` (thawed and emptied first)."""
        removed = []
        for run in dead_runs:
            for cg in cls.of_run(run):
                cg.remove()
                removed.append(f"cgroup {cg.path}")
            with contextlib.suppress(OSError):
                cls.run_dir(run).rmdir()
            # limit groups whose freezer group was already gone
            left = cls.limit_leftovers(run)
            _remove_limit_dirs(left)
            removed += [f"cgroup {d}" for d in left]
        return removed


def cgroup_leftovers(run_id: str, prefix: str) -> list[str]:
    """The run's sandbox cgroups, one line per sandbox (its pids and memory groups go with its freezer
    group), and limit groups left without a freezer group."""
    groups = FreezerCgroup.of_run(run_id, prefix)
    named = {cg.path.name for cg in groups}
    return [f"cgroup {cg.path}" + (" (with its pids and memory groups)" if cg.limit_dirs else "") for cg in groups] + \
        [f"cgroup {d}" for d in FreezerCgroup.limit_leftovers(run_id, prefix) if d.name not in named]


def _remove_limit_dirs(dirs: Sequence[Path]) -> list[str]:
    """Kill what is left in the limit groups ``dirs``, remove them and their empty run folders."""
    problems = []
    for d in dirs:
        try:
            pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pids = []
        if pids:
            kill_pids(pids)
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append(f"cgroup {d}: {e}")
        with contextlib.suppress(OSError):
            d.parent.rmdir()
    return problems


def host_probe(sandbox_id: str, destroyed: bool, cgroup: FreezerCgroup | None,
               gone: Callable[[], str | None]) -> str | None:
    """``Sandbox.probe`` of a sandbox of host processes: destroyed, what its freezer cgroup says
    (frozen by the host, gone), then ``gone()`` (the sandbox's own host resource missing).

    No liveness command: it would run under the sandbox's own limits, which the policy can exhaust
    (a fork bomb), and so would not be evidence out of its reach."""
    if destroyed:
        return f"sandbox {sandbox_id} is destroyed"
    return (cgroup.evidence() if cgroup is not None else None) or gone()


class CgroupFreezable(Freezable):
    """``Freezable`` through the sandbox's freezer cgroup (writes ``freezer.state``)."""

    cgroup: FreezerCgroup | None

    def freeze(self) -> None:
        assert self.cgroup is not None
        self.cgroup.write_state("FROZEN")

    def thaw(self) -> None:
        assert self.cgroup is not None
        if self.cgroup.exists():
            self.cgroup.write_state("THAWED")


# -- size-limited sandbox folders (process, bwrap) ----------------------------------------------

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_limited(folder: Path, size_mb: int, source: str = "tmpfs", mode: int = 0o755) -> None:
    """Mount a tmpfs of ``size_mb`` MiB (root's, 0755, nosuid, nodev) on the existing ``folder``: the
    sandbox's disk bound. A write past it fails with ENOSPC inside the tmpfs, never on the host's
    file system; its pages are charged to the writer's memory cgroup (the sandbox's memory bound
    covers them too). ``SubstrateError`` when the mount fails."""
    data = f"size={size_mb}m,mode={mode:o}".encode()
    if _libc().mount(source.encode(), os.fsencode(folder), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), data) != 0:
        err = ctypes.get_errno()
        raise SubstrateError(f"cannot mount a {size_mb} MiB tmpfs on {folder}: {os.strerror(err)}")


def mounts_below(folder: Path) -> list[str]:
    """Mount points in this process's mount namespace at or below ``folder``, deepest first."""
    prefix = os.path.realpath(folder)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].replace("\\040", " ")
                if point == prefix or point.startswith(prefix + "/"):
                    found.append(point)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def unmount_below(folder: Path) -> list[str]:
    """Detach every mount at or below ``folder`` (a sandbox's tmpfs); returns the mount points."""
    done = []
    libc = _libc()
    for point in mounts_below(folder):
        if libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
            done.append(point)
    return done


def mounts_of_source(prefix: str) -> list[str]:
    """Mount points (this mount namespace) of tmpfs mounts whose source starts with ``prefix``."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = right.split()
                if len(fields) >= 2 and fields[0] == "tmpfs" and fields[1].startswith(prefix):
                    found.append(left.split()[4].replace("\\040", " "))
    except OSError:
        pass
    return found


def unmount(point: str) -> bool:
    """Detach the mount at ``point`` (lazily: a user of it keeps it until done)."""
    return bool(_libc().umount2(os.fsencode(point), _MNT_DETACH) == 0)
