"""Start a host sandbox's commands from inside its cgroups (the harness's side of ``spawner_main``).

Why: a command that joins a cgroup v1 group (``echo $$ > cgroup.procs``) waits for an RCU grace
period whenever no attach ran in the last few milliseconds — 7-17 ms on the 2-core test host, paid
by the first command after any pause (a verification, a policy's think time). A command forked by
a process that is already in the groups is born there and pays nothing.

``Spawner.start`` starts ``spawner_main`` as the harness's uid in the sandbox's groups (one attach,
once), in its own session; ``spawn`` hands it one command with its three pipes and returns a
``SpawnedProcess`` that ``exec_core.run_bounded`` supervises like a ``Popen`` (``None`` while the
spawner is not ready or after it failed: the caller starts the command itself, the old way). The
sandbox spares the spawner's pid when it kills its processes (``HostFolderSandbox.kill_all``) and
stops it on ``destroy``. Nothing of the sandbox can reach it: it runs as another uid, its socket has
no name, and a command keeps none of its descriptors.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

SOURCE = (Path(__file__).parent / "spawner_main.py").read_text()
# A request larger than this (a huge environment or command line) is started the old way.
_MAX_REQUEST = 512 * 1024
# The spawner's interpreter: the system's (a sandbox's own view covers the harness's checkout,
# where its virtual environment may live: ``own_view``); the harness's where there is none.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
# How long ``SpawnedProcess.wait`` waits for the spawner's exit message after the command ended.
_EXIT_WAIT_S = 5.0


class SpawnTimeout(Exception):
    """The spawner did not answer a request in time (its sandbox is frozen or starved); it is not
    used again."""


class SpawnedProcess:
    """A command started by the spawner, with the part of ``subprocess.Popen`` that
    ``run_bounded`` uses: ``pid``, the pipes, ``pidfd`` (names this very process), ``poll``, ``wait``."""

    def __init__(self, pid: int, pidfd: int, reply: socket.socket, stdin: IO[bytes] | None,
                 stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self._reply = reply
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def _read_code(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._reply], [], [], timeout)
        if not ready:
            return None
        data = self._reply.recv(64)
        # b"" / no "exit": the spawner was killed (the sandbox is going), and its command with it
        self.returncode = int(data.split()[1]) if data.startswith(b"exit ") else -signal.SIGKILL
        self._reply.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._read_code(0)

    def wait(self, timeout: float = _EXIT_WAIT_S) -> int:
        """The exit code, which the spawner sends once it has reaped the command; a spawner that
        does not send it within ``timeout`` (frozen since) gives ``-SIGKILL``."""
        code = self._read_code(timeout)
        if code is None:
            self.returncode = -signal.SIGKILL
            return self.returncode
        return code

    def close(self) -> None:
        """Release the pidfd and the reply socket (the pipes are the caller's)."""
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        self._reply.close()


class Spawner:
    """One sandbox's spawner (see the module)."""

    def __init__(self, proc: subprocess.Popen[bytes], ctl: socket.socket) -> None:
        self._proc = proc
        self._ctl = ctl
        self._ready = False
        self._dead = False
        self._lock = threading.Lock()

    @classmethod
    def start(cls, wrap: Callable[[list[str]], list[str]], uid: int, cwd: str, env: Mapping[str, str]) -> Spawner:
        """Start it (``wrap``: the argv that places it in the sandbox's groups first); does not wait
        for it to be ready. ``OSError`` when it cannot start."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * _MAX_REQUEST)
            argv = wrap([PYTHON, "-I", "-S", "-c", SOURCE, str(uid)])
            proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, cwd=cwd, env=dict(env), start_new_session=True)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(proc, ours)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def failed(self) -> bool:
        """It ended, said something else than ``ready``, or did not answer: not used again."""
        return self._dead

    def usable(self) -> bool:
        """Ready and not failed (reads its ``ready`` without waiting)."""
        if self._dead:
            return False
        if not self._ready:
            ready, _, _ = select.select([self._ctl], [], [], 0)
            if not ready:
                return False
            with contextlib.suppress(OSError):
                self._ready = self._ctl.recv(16) == b"ready"
            if not self._ready:
                self._dead = True
        return self._ready

    def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: bool,
              timeout: float) -> SpawnedProcess | None:
        """Start ``argv``; ``None`` when the spawner cannot (not ready, failed, a request too large, an
        error of its own): the caller starts it the old way. ``SpawnTimeout`` when it gave no answer
        within ``timeout`` (a frozen sandbox). Only an answer ``pid`` with a pidfd gives a process."""
        if not self.usable():
            return None
        msg = json.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env)}).encode()
        if len(msg) > _MAX_REQUEST:
            return None
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ok = False
        try:
            fds = array.array("i", [theirs.fileno(), in_r, out_w, err_w])
            with self._lock:
                self._ctl.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            theirs.close()
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            in_r = out_w = err_w = -1
            ready, _, _ = select.select([reply], [], [], timeout)
            if not ready:
                self._dead = True  # a request it answers late must not start a command late: stop it
                self.stop()
                raise SpawnTimeout(f"the spawner gave no answer within {timeout:g} s")
            got = array.array("i")
            data, ancdata, _, _ = reply.recvmsg(256, socket.CMSG_SPACE(got.itemsize))
            for level, kind, raw in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got.frombytes(raw[:len(raw) - len(raw) % got.itemsize])
            if not data.startswith(b"pid ") or len(got) != 1:
                for fd in got:
                    os.close(fd)
                return None
            proc = SpawnedProcess(int(data.split()[1]), got[0], reply,
                                  os.fdopen(in_w, "wb") if stdin else None,
                                  os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
            ok = True
            return proc
        except OSError:
            self._dead = True
            return None
        finally:
            theirs.close()
            for fd in (in_r, out_w, err_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if not ok:
                reply.close()
                for fd in (out_r, err_r, in_w):
                    if fd >= 0:
                        with contextlib.suppress(OSError):
                            os.close(fd)

    def stop(self) -> None:
        """Kill it; idempotent. The commands it started are the sandbox's to kill."""
        self._dead = True
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._ctl.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=0.5)  # a frozen spawner dies only when thawed
