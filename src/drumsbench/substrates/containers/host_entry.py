"""Entering a running container from the host: how an environment launches its own process tree in
a container sandbox (``ViewLaunching``) and runs harness-made launchers into it (``HostLaunching``).

Both engines run containers with runc, so a container's processes are host processes in the
container's namespaces and cgroups. Given the host pid of the container's pid 1 (the engine's
record), the harness (root) can

- join the container's cgroups: every hierarchy's group that pid 1 is in (``cgroup_procs_files``),
  so the container's pids and memory limits count what it starts, ``pause`` freezes it, the devices
  group bounds it and removing the container ends it;
- enter the container's mount, uts, ipc, network and pid namespaces (``nsenter``): the file view of
  the container's own commands (its image and ``/sandbox``), no network;
- reach the container's files at ``/proc/<pid>/root`` (the container's root as the kernel resolves
  it for that process).

What the engine gives its own commands and an entry from the host does not: the engine's reduced
capability set and no_new_privs (the launched tree drops to the first and sets the second itself:
``LaunchView.keep_caps``, read from pid 1's ``CapBnd``), and the engine's seccomp filter (not
applied; docs/desktop.md says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, HostLaunching, LaunchView
from drumsbench.substrates.exec_core import run_bounded
from drumsbench.substrates.hostproc import VIEW_APP_UID, give_folders

# sh: write its own pid to every cgroup.procs file named before "--", then run the rest (exit 125
# when a group cannot be joined: nothing runs outside the container's bounds)
JOIN_GROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# new namespaces below the container's for the launched tree (the desktop's holder is their pid 1)
TREE_NAMESPACES = ("unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "--mount", "--mount-proc",
                   "--propagation", "private", "--")
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _cgroup_mounts() -> tuple[list[tuple[frozenset[str], str]], str | None]:
    """The host's cgroup mounts: each v1 hierarchy root's mount options with its mount point, and
    the v2 mount point (None when absent)."""
    v1: list[tuple[frozenset[str], str]] = []
    v2: str | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if "-" not in fields or fields[3] != "/":  # fields[3] != "/": a bind of a sub-group
            continue
        sep = fields.index("-")
        fstype = fields[sep + 1]
        options = fields[sep + 3] if len(fields) > sep + 3 else ""
        if fstype == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif fstype == "cgroup":
            v1.append((frozenset(options.split(",")), fields[4]))
    return v1, v2


def cgroup_procs_files(pid: int) -> list[str]:
    """The ``cgroup.procs`` file of every cgroup ``pid`` is in, in every hierarchy mounted on the host.

    ``SubstrateError`` when ``pid`` is gone or one of its v1 groups has no mount on the host (a
    launcher would then run outside the container's bounds)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as e:
        raise SubstrateError(f"the container's pid 1 ({pid}) is gone: {e.strerror}") from None
    v1, v2 = _cgroup_mounts()
    files = []
    for line in lines:
        _num, controllers, path = line.split(":", 2)
        if controllers == "":
            if v2 is not None:
                files.append(f"{v2}{path.rstrip('/')}/cgroup.procs")
            continue  # a v2 group without a v2 mount here: no controller of it is in use
        want = set(controllers.split(","))
        root = next((point for options, point in v1 if want <= options), None)
        if root is None:
            raise SubstrateError(f"the container's cgroup {controllers}:{path} is not mounted on the host")
        files.append(f"{root}{path.rstrip('/')}/cgroup.procs")
    return files


def host_cgroup_dir(pid: int, missing_ok: bool = False) -> Path | None:
    """The host folder of ``pid``'s process group: its group of the v1 ``pids`` hierarchy, else its
    v2 group. ``SubstrateError`` (None with ``missing_ok``) when ``pid`` is gone or its group is a
    hierarchy's root (every process of the host)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as e:
        if missing_ok:
            return None
        raise SubstrateError(f"the container's pid 1 ({pid}) is gone: {e.strerror}") from None
    v1, v2 = _cgroup_mounts()
    groups = dict(line.split(":", 2)[1:] for line in lines)
    if "pids" in groups:
        root = next((point for options, point in v1 if "pids" in options), None)
        path = groups["pids"]
    else:
        root, path = v2, groups.get("", "/")
    if root is None or path.rstrip("/") == "":
        if missing_ok:
            return None
        raise SubstrateError(f"process {pid} has no process group of its own on the host (pids {path})")
    return Path(root + path.rstrip("/"))


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (``/proc/<pid>/stat``'s 22nd field, clock ticks after boot): with the
    pid, one process and no later one. None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def bounding_caps(pid: int) -> int:
    """The capability bounding set of ``pid`` (``CapBnd`` of its status) as a bit mask."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        raise SubstrateError(f"the container's pid 1 ({pid}) is gone: {e.strerror}") from None
    for line in status.splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise SubstrateError(f"no CapBnd in /proc/{pid}/status")


@dataclass(frozen=True)
class Entry:
    """What the host needs to enter one running container, read once (a container's pid 1, its
    groups and its capabilities do not change while it runs): ``pid`` is its pid 1 on the host,
    ``groups`` the ``cgroup.procs`` files of its groups, ``caps`` its bounding set, ``started`` its
    start time (``/proc/<pid>/stat``'s 22nd field: with the pid, that process and no later one)."""

    pid: int
    groups: tuple[str, ...]
    caps: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Entry:
        started = start_time(pid)
        if started is None:
            raise SubstrateError(f"the container's pid 1 ({pid}) is gone")
        return cls(pid, tuple(cgroup_procs_files(pid)), bounding_caps(pid), started)

    def joined(self) -> tuple[str, ...]:
        """argv prefix: what follows runs on the host in the container's cgroups (``JOIN_GROUPS``)."""
        return ("/bin/sh", "-c", JOIN_GROUPS, "join", *self.groups, "--")

    def entered(self) -> tuple[str, ...]:
        """argv prefix: what follows runs in the container's cgroups and namespaces."""
        return (*self.joined(), "nsenter", "-t", str(self.pid), "-m", "-u", "-i", "-n", "-p", "--")


def launch_view(entry: Entry, root: str) -> LaunchView:
    """``ViewLaunching.launch_view`` of the container of ``entry``; ``root``: the sandbox's root folder
    inside it (``/sandbox``). The tree joins the container's cgroups, enters its namespaces, gets new
    ones of its own below them and drops to the container's capabilities; the container's layer
    is read-only in them but for the sandbox's folder and /tmp (``LaunchView.read_only_system``).
    The tree's applications (LibreOffice) run as ``VIEW_APP_UID``, never the container's root (no
    user namespace: the container's root is the host's), with the sandbox's work, home and tmp
    handed to that uid."""
    host_root = Path(f"/proc/{entry.pid}/root{root}")
    return LaunchView((*entry.entered(), *TREE_NAMESPACES), host_root, root, drop_admin=True, keep_caps=entry.caps,
                      read_only_system=True, app_ids=give_folders(host_root, VIEW_APP_UID))


# run by python3 in the container's namespaces: the harness's descriptors closed, stdio on the
# container's /dev/null, then a fork whose parent exits: the child (the launched command) is an
# orphan of the container's pid namespace, adopted by its init (a podman checkpoint dumps init's tree)
DETACH = (
    "import os, sys\n"
    "os.closerange(3, 1 << 16)\n"
    "fd = os.open('/dev/null', os.O_RDWR)\n"
    "for i in (0, 1, 2):\n"
    "    os.dup2(fd, i)\n"
    "os.close(fd) if fd > 2 else None\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def init_view(entry: Entry, root: str) -> LaunchView:
    """``InitLaunching.init_view`` of the container of ``entry``: the tree joins the container's
    cgroups, enters all its namespaces and is detached to become a child of its init (``DETACH``),
    with the container's capabilities; its /tmp is the container's."""
    return LaunchView((*entry.entered(), "python3", "-I", "-S", "-c", DETACH), Path(f"/proc/{entry.pid}/root{root}"),
                      root, drop_admin=True, keep_caps=entry.caps, init_pid=entry.pid,
                      host_tmp=Path(f"/proc/{entry.pid}/root/tmp"))


def run_launcher(entry: Entry, run_id: str, sandbox_id: str, argv: Sequence[str], *, timeout: float,
                 env: Mapping[str, str] | None, stdin: bytes | None,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
    """``HostLaunching.exec_launcher`` of the container of ``entry``: ``argv`` runs on the host as root
    from ``/`` (its own ``nsenter`` enters where it needs to), in the container's cgroups, labelled,
    bounded and killed on timeout."""
    labels = {HostLaunching.RUN_VAR: run_id, HostLaunching.SANDBOX_VAR: sandbox_id}
    full_env = {"PATH": HOST_PATH, "LANG": "C.UTF-8", **(env or {}), **labels}
    return run_bounded([*entry.joined(), *argv], timeout=timeout, cwd="/", env=full_env, stdin=stdin,
                       output_limit=output_limit)
