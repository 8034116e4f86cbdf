"""Live checkpoint/restore of a process tree with CRIU: the primitive behind the ``criu`` fork method.

The recipe (checked on these machines, see docs/branch.md):

- the tree runs in its own pid, ipc, uts and net namespaces — **not** its own mount namespace
  (CRIU refuses host mounts it cannot restore) — with its first process a session leader inside
  them and all stdio on /dev/null: ``unshare --fork --pid --ipc --uts --net setsid PROG``;
- no client of the harness may be connected at dump time (use short-lived clients);
- ``criu dump --leave-stopped --file-locks`` once, the tree's folders copied while it is stopped,
  then the parent goes on;
- each continuation: a private mount namespace in which the tree's folders are bind-mounted from
  private copies **at the same paths**, then ``criu restore --restore-detached --file-locks``.
  The restored tree lives in that mount namespace; reach its files and sockets with
  ``nsenter --target PID --mount``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drumsbench.core import criu_binary as criu_install
from drumsbench.core.errors import SubstrateError


def criu_bin() -> str:
    path = criu_install.criu_path()
    if path is None:
        raise SubstrateError(criu_install.missing() or "no CRIU")
    return path


@dataclass
class LiveTree:
    """A process tree started ready for checkpointing. ``pid`` is its first process (host pid)."""

    pid: int
    holder: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float = 10.0) -> LiveTree:
        # No --kill-child: a parent-death signal is task state that CRIU restores, and would kill
        # every continuation the moment its restorer exits. ``kill`` ends the tree instead.
        holder = subprocess.Popen(
            ["unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "setsid", *argv],
            cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = _children(holder.pid)
            if children:
                return cls(children[0], holder)
            if holder.poll() is not None:
                raise SubstrateError(f"namespace holder exited with {holder.returncode} before starting {argv[0]}")
            time.sleep(0.005)
        holder.kill()
        raise SubstrateError(f"{argv[0]} did not start in its namespaces within {timeout:g} s")

    def kill(self) -> None:
        """Kill the tree (its namespace's first process takes the rest with it) and its holder."""
        for pid in (self.pid, self.holder.pid if self.holder else None):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.holder is not None:
            self.holder.wait()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def all_children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (a child forked by a secondary thread is listed only in
    that thread's ``children`` file: LibreOffice's oosplash starts soffice.bin from one)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError):
            out += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(all_children(p))
    return out


def _signal_tree(pids: Sequence[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def checkpoint(pid: int, images: Path, copies: Mapping[str, str] | None = None,
               phases: dict[str, float] | None = None) -> float:
    """``criu dump --leave-running`` of the tree rooted at ``pid`` into ``images``; seconds taken.

    With ``copies`` (live folder -> frozen copy), the folders are copied while the tree is stopped,
    so the files and the memory image describe the same instant; continuations then start from
    the frozen copies, never from the live folders. ``phases`` receives ``dump_s`` and ``copy_s``.
    """
    images.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # --leave-stopped: CRIU freezes the tree for the dump and leaves it stopped, so the copies below
    # see the files as they were at the dump; then the parent is let go.
    proc = subprocess.run([criu_bin(), "dump", "-t", str(pid), "-D", str(images), "--leave-stopped",
                           "--file-locks", "-o", "dump.log", "-v2"], capture_output=True, text=True, timeout=120)
    try:
        if proc.returncode != 0:
            raise SubstrateError(f"criu dump failed: {log_errors(images / 'dump.log')}")
        t1 = time.monotonic()
        for src, dst in (copies or {}).items():
            subprocess.run(["cp", "-a", src, dst], check=True, capture_output=True, timeout=120)
        if phases is not None:
            phases.update(dump_s=t1 - t0, copy_s=time.monotonic() - t1)
    finally:
        _signal_tree(tree_pids(pid), signal.SIGCONT)
    return time.monotonic() - t0


def restore(images: Path, binds: Mapping[str, str], pidfile: Path) -> int:
    """Restore the tree once, in a private mount namespace where each ``binds`` target path shows its
    private copy; returns the restored tree's first process (host pid)."""
    pidfile.unlink(missing_ok=True)
    mounts = " && ".join(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}" for dst, src in binds.items())
    log = f"restore-{pidfile.stem}.log"
    prefix = f"{mounts} && " if mounts else ""
    script = (f"{prefix}exec {shlex.quote(criu_bin())} restore -D {shlex.quote(str(images))} "
              f"--restore-detached --file-locks --pidfile {shlex.quote(str(pidfile))} -o {log} -v2")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not pidfile.exists():
        raise SubstrateError(f"criu restore failed: {log_errors(images / log) or proc.stderr.strip()[-300:]}")
    return int(pidfile.read_text().strip())


def log_errors(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines()
                 if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    except OSError:
        return ""
    return " | ".join(lines[-3:])[-400:]


def in_mount_ns(pid: int, argv: Sequence[str], timeout: float = 30.0,
                **kw: Any) -> subprocess.CompletedProcess[bytes]:
    """Run a short-lived client inside the mount namespace of restored process ``pid``."""
    return subprocess.run(["nsenter", "--target", str(pid), "--mount", "--", *argv], capture_output=True,
                          timeout=timeout, **kw)
