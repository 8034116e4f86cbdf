"""A host sandbox's own network and mount namespaces (``process``): what its commands see.

``OwnView.create(hidden, folder)`` makes

- a **network namespace with only ``lo``** (up): a command reaches nothing of the host's network,
  its loopback included (the service, Ray, an inference endpoint on 127.0.0.1), and can still
  serve and connect on its own loopback;
- a **mount namespace** copied from the host's (propagation ``slave``: host mounts made later still
  show, the sandbox's never reach the host) in which every top-level folder that is not the
  system's (``answer_keys.SYSTEM_FOLDERS``: ``/usr``, ``/etc``, ``/var``, ``/tmp``, ...; so ``/work``, ``/home``,
  ``/root``, ``/opt``, ``/srv``: checkouts and copies of task suites) and every folder of ``hidden``
  (``core.answer_keys``: the package, its checkout, the run's suite) is covered by an empty
  read-only tmpfs of mode 0, not even listable by a sandbox uid. Where a covered folder holds the
  sandbox's own ``folder``, the tmpfs is a read-only skeleton (mode 0755) with ``folder`` bound back
  at its path (from a descriptor opened before the cover). What stays in sight is the system as
  the sandbox's uid sees it (root's files read-only to it by their modes), the host's shared places
  (``/tmp``, ``/var/tmp``: ``core.host_places``) and the sandbox's own folders.

No process keeps the namespaces: the harness holds them by descriptor (they end with ``close``,
or with the harness and the last command inside). ``prefix(cwd, uid)`` is the argv that runs a
command inside them: ``nsenter`` (as root) enters both by the harness's descriptors
(``/proc/<harness>/fd/<n>``), drops to ``uid`` (the gid of the same number, no supplementary
groups: ``nsenter --setuid --setgid`` clears them; the drop must come after ``setns``, which needs
root), and ``env -C`` sets the working folder by its path in the view. Neither forks: the
command's pid is the one the harness started.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from drumsbench.core.answer_keys import SYSTEM_FOLDERS
from drumsbench.core.errors import SubstrateError

_SETUP_TIMEOUT_S = 10.0
# By absolute path: a command's environment (its PATH) is the sandbox's, which may lack them.
_NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
_ENV = shutil.which("env") or "/usr/bin/env"


def _fstab_path(path: Path) -> str:
    """``path`` as a mount table writes it (octal escapes for space, tab, newline and backslash)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in str(path))


def available() -> str | None:
    """Why no own view can be made here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (it makes network and mount namespaces and enters them)"
    missing = [t for t in ("unshare", "nsenter", "ip", "mount") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (util-linux, iproute2)"
    return None


def covered_places(hidden: Sequence[Path], folder: Path) -> list[Path]:
    """The outermost folders to cover: the non-system top-level folders and ``hidden`` (real paths,
    deduplicated), without any inside ``folder`` (the sandbox's own, which stays in sight)."""
    tops = [Path("/", n) for n in os.listdir("/") if n not in SYSTEM_FOLDERS]
    keep = Path(os.path.realpath(folder))
    places = sorted({Path(os.path.realpath(p)) for p in [*tops, *hidden]
                     if os.path.isdir(p) and not os.path.islink(p)})
    out: list[Path] = []
    for p in places:
        if p == keep or keep in p.parents or any(o in p.parents for o in out):
            continue
        out.append(p)
    return out


class OwnView:
    """The two namespaces, held by descriptor; ``covered``: the folders hidden in it."""

    def __init__(self, net_fd: int, mnt_fd: int, covered: list[Path]) -> None:
        self._net_fd = net_fd
        self._mnt_fd = mnt_fd
        self.covered = covered
        self._closed = False

    @classmethod
    def create(cls, hidden: Sequence[Path], folder: Path) -> OwnView:
        """``SubstrateError`` when the namespaces cannot be made (the cause in one line)."""
        covered = covered_places(hidden, folder)
        keep = Path(os.path.realpath(folder))
        q = shlex.quote
        steps = [f"exec 3< {q(str(keep))}"]
        plain = [p for p in covered if p not in keep.parents]
        # the plain covers in one ``mount -a`` of a table (one exec, not one per cover: ~1.8 ms each)
        table = keep / ".drumsbench-covers"
        if plain:
            table.write_text("".join(f"drumsbench-hidden {_fstab_path(p)} tmpfs ro,mode=0,size=4k,nosuid,nodev,noexec"
                                     " 0 0\n" for p in plain))
            steps.append(f"mount -a -T {q(str(table))}")
        for p in covered:
            if p in keep.parents:  # a skeleton with the sandbox's folder bound back
                steps += [f"mount -t tmpfs -o mode=0755,size=1m,nosuid,nodev,noexec drumsbench-hidden {q(str(p))}",
                          f"mkdir -p {q(str(keep))}", f"mount -c --rbind /proc/self/fd/3 {q(str(keep))}",
                          f"mount -o remount,ro {q(str(p))}"]
        steps += ["exec 3<&-", "ip link set lo up"]
        # The shell makes the view, says so, and waits for the harness to take the namespaces.
        script = " && ".join(steps) + " && echo ready && read _"
        try:
            return cls._make(script, covered)
        finally:
            table.unlink(missing_ok=True)

    @classmethod
    def _make(cls, script: str, covered: list[Path]) -> OwnView:
        try:
            proc = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "slave", "--",
                                     "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise SubstrateError(f"own view: cannot start unshare: {e}") from e
        assert proc.stdin is not None and proc.stdout is not None
        fds: list[int] = []
        try:
            line = proc.stdout.readline()
            if line.strip() != b"ready":
                proc.kill()
                _, err = proc.communicate(timeout=_SETUP_TIMEOUT_S)
                raise SubstrateError(f"own view: cannot make the namespaces: {err.decode(errors='replace').strip()}")
            for ns in ("net", "mnt"):
                fds.append(os.open(f"/proc/{proc.pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=_SETUP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()
        return cls(fds[0], fds[1], covered)

    def prefix(self, cwd: str, uid: int | None) -> list[str]:
        """The argv before a command that runs it inside the view, in ``cwd`` (a path of the view:
        the sandbox's folders are at their host paths), as ``uid`` (None: root)."""
        if self._closed:
            raise SubstrateError("own view: closed")
        me = os.getpid()
        argv = [_NSENTER, f"--net=/proc/{me}/fd/{self._net_fd}", f"--mount=/proc/{me}/fd/{self._mnt_fd}"]
        if uid is not None:
            argv += [f"--setuid={uid}", f"--setgid={uid}"]
        # The working folder is set by path once inside (``env -C``), never with nsenter's --wd:
        # that opens the folder before entering, so the command's cwd would be the host's mount of
        # it and ``../..`` would walk the host's tree, around every cover.
        return [*argv, "--", _ENV, "-C", cwd, "--"]

    def close(self) -> None:
        """Let go of the namespaces (they end when the last command inside ends too)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._net_fd, self._mnt_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
