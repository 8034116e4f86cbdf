"""What the harness does to a running container from the host, never through a program of the
container's: ending its processes and reading its files for the gates.

A container sandbox's commands run as the container's root, so every program in its image can be
replaced by the policy (``/usr/bin/python3`` made ``exit 1``, or ``exit 0``). A gate that runs such a
program in the container is then the policy's to break (an error: invalid, an escape from a 0) or
to fake (``exit 0``: "every process ended", "no canary found"). So the gates run here:

- ``end_all`` kills every process in the container's process group (cgroup) but its pid 1 (the
  reaper), from the host, by pidfd (a pid reused meanwhile is never signalled), until none is left;
- ``kill_marked`` kills one exec's processes (those whose environment holds its marker, and the
  sessions they lead) the same way;
- ``run_in_mounts`` runs a script with **the harness's own interpreter**, started on the host with
  every module the script needs already imported, then moved into the container's mount namespace
  (``setns``): the script sees the container's files with the container's view of links, and runs
  no code the container holds.

The processes are found through the host's cgroup file system (``process_group``): a container's
processes, and everything the harness launched into it (``host_entry.Entry.joined``), are in its
groups; its root cannot move itself out (its cgroup file system is read-only and it has no
``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, SandboxFrozen
from drumsbench.substrates.containers.host_entry import Entry, host_cgroup_dir, start_time
from drumsbench.substrates.exec_core import run_bounded

ROUNDS = 200  # kill rounds before "processes survive SIGKILL" (a fork bomb is bounded by the pids group)


def _stat(pid: int) -> list[bytes] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def container_group(entry: Entry) -> Path:
    """The host folder of the container's process group, once its pid 1 is known to be the one
    ``entry`` was read of (its start time; a pid reused after the container ended is not)."""
    top = host_cgroup_dir(entry.pid, missing_ok=True)  # read first: the same start time after means it was
    if top is None or start_time(entry.pid) != entry.started:  # that process's group
        raise SubstrateError(f"the container's pid 1 ({entry.pid}) is gone")
    return top


def members(top: Path) -> list[int]:
    """The live (not zombie) processes of the group at host folder ``top`` and its sub-groups."""
    pids: list[int] = []
    for dirpath, _dirs, _files in os.walk(top):
        try:
            text = Path(dirpath, "cgroup.procs").read_text()
        except OSError:
            continue
        for word in text.split():
            fields = _stat(int(word))
            if fields and fields[0] not in (b"Z", b"X"):
                pids.append(int(word))
    return pids


def _signal(top: Path, pid: int) -> None:
    """SIGKILL to ``pid`` through a pidfd, only if it is (still) in the group at ``top`` once the pidfd
    is held (a pid reused outside the container before is never signalled)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        group = host_cgroup_dir(pid, missing_ok=True)
        if group is None or not (group == top or top in group.parents):
            return
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def frozen(entry: Entry) -> bool:
    """Whether the host froze the container (``docker pause``, the fault injector): its v1 freezer
    group not ``THAWED``, or its v2 group ``frozen``. Its processes then die only once thawed."""
    for procs in entry.groups:
        folder = Path(procs).parent
        with contextlib.suppress(OSError):
            if (folder / "freezer.state").read_text().strip() not in ("", "THAWED"):
                return True
        with contextlib.suppress(OSError):
            if "frozen 1" in (folder / "cgroup.events").read_text().splitlines():
                return True
    return False


def _kill_until_none(entry: Entry, victims: Callable[[list[int]], set[int]], what: str) -> None:
    """SIGKILL the processes ``victims`` picks of the container's (but pid 1) until it picks none.
    ``SandboxFrozen`` when the container is frozen (the signals are delivered once it is thawed)."""
    top = container_group(entry)
    left: set[int] = set()
    for _ in range(ROUNDS):
        left = victims([p for p in members(top) if p != entry.pid])
        if not left:
            return
        for pid in left:
            _signal(top, pid)
        if frozen(entry):
            raise SandboxFrozen(f"{what}: the container is frozen; its {len(left)} process(es) end once thawed")
        time.sleep(0.01)
    raise SubstrateError(f"{what}: processes survive SIGKILL: {' '.join(map(str, sorted(left)[:20]))}")


def end_all(entry: Entry) -> None:
    """Kill every process of the container but its pid 1; ``SubstrateError`` when some survive."""
    _kill_until_none(entry, set, "ending the sandbox's processes")


def kill_marked(entry: Entry, marker: bytes) -> None:
    """Kill the processes whose environment holds ``marker`` (``NAME=value``) and the members of the
    sessions they lead (children that cleared their environment); repeated until none is left."""

    def victims(pids: list[int]) -> set[int]:
        marked, session_of = set(), {}
        for pid in pids:
            fields = _stat(pid)
            try:
                session_of[pid] = int(fields[3]) if fields else -1
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        marked.add(pid)
            except (OSError, IndexError, ValueError):
                continue
        leaders = {p for p in marked if session_of.get(p) == p}
        return marked | {p for p, s in session_of.items() if s in leaders}

    _kill_until_none(entry, victims, "killing a timed-out command")


# Run by the harness's interpreter: every module the script imports is imported first, then the
# process enters the container's mount namespace (its root and working folder become the container's)
# after checking that pid 1 is still the container's (its start time), then runs the script.
_ENTER = """\
import ctypes, hashlib, json, os, stat, sys
_pid, _started = int(sys.argv[1]), sys.argv[2]
_fd = os.open("/proc/%d/ns/mnt" % _pid, os.O_RDONLY)
with open("/proc/%d/stat" % _pid, "rb") as _f:
    if _f.read().rsplit(b")", 1)[1].split()[19].decode() != _started:
        sys.exit("the container's pid 1 is gone")
if ctypes.CDLL(None, use_errno=True).setns(_fd, 0x00020000) != 0:
    sys.exit("setns: " + os.strerror(ctypes.get_errno()))
os.close(_fd)
os.chdir("/")
sys.argv = sys.argv[2:]
"""


def run_in_mounts(entry: Entry, script: str, args: Sequence[str] = (), *, timeout: float,
                  stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
    """``script`` (``sys.argv[1:]`` = ``args``) run by the harness's interpreter in the container's
    mount namespace (``_ENTER``: it may import only ``ctypes, hashlib, json, os, stat, sys``); it stays in
    the host's other namespaces and cgroups, as root."""
    argv = [sys.executable, "-I", "-S", "-c", _ENTER + script, str(entry.pid), str(entry.started), *args]
    return run_bounded(argv, timeout=timeout, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                       stdin=stdin, output_limit=output_limit)
