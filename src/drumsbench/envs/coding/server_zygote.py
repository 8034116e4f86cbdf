"""The boundary server kept warm in a sandbox that keeps helpers (``Helpers``: the process substrate).

``ServerZygote(box)`` starts ``boundary_server.py --zygote`` through ``box.start_helper`` (as the
harness's uid, spared by ``end_processes``, out of the sandbox uid's reach; see
``boundary_server.zygote_main``) with one end of a Unix socket. ``open()`` hands it two pipe ends
and gets back a pidfd of the forked server, which runs as the sandbox's uid in the work folder:
a ``ZygoteStream``, the same contract as ``Streaming.open_stream``'s streams except that ``poll``
knows only whether the server ended (its status is the zygote's, not reported: ``None``).

What this saves is the interpreter's start and the codec's imports per verification; what the
server then does (import the work tree, answer the judge) is exactly what a fresh server does.
The zygote holds no secret and never imports the work tree: a policy that could reach it would
gain nothing the server's own answers do not already give it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import Helper, Helpers, Sandbox, Stream

SOURCE = (Path(__file__).parent / "boundary_server.py").read_text()
_ANSWER_S = 10.0  # the zygote forks and answers in milliseconds; a silent one is replaced


class ZygoteStream(Stream):
    """A server forked by the zygote (see the module)."""

    def __init__(self, pidfd: int, stdin_w: int, stdout_r: int, on_close: Callable[[], None]) -> None:
        self._pidfd = pidfd
        self._fds: dict[str, int | None] = {"stdin": stdin_w, "stdout": stdout_r}
        self._on_close = on_close
        self._closed = False

    def _fd(self, name: str) -> int:
        fd = self._fds[name]
        if fd is None:
            raise ValueError(f"the stream's {name} is closed")
        return fd

    @property
    def stdin_fd(self) -> int:
        return self._fd("stdin")

    @property
    def stdout_fd(self) -> int:
        return self._fd("stdout")

    def close_stdin(self) -> None:
        fd = self._fds["stdin"]
        if fd is not None:
            self._fds["stdin"] = None
            os.close(fd)

    def poll(self) -> int | None:
        """None: its status is not known here (see the module), whether or not it ended."""
        return None

    def ended(self) -> bool:
        if self._closed:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(ready)

    def close(self, timeout: float = 5.0) -> int | None:
        if self._closed:
            return None
        self._closed = True
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        os.close(self._pidfd)
        for name in ("stdin", "stdout"):
            fd = self._fds[name]
            if fd is not None:
                self._fds[name] = None
                os.close(fd)
        # what the server started (its session left behind): the sandbox's processes end, helpers spared
        self._on_close()
        return None


class ServerZygote:
    """One zygote per sandbox, started at reset (``CodingEnv``); ``open`` per verification."""

    def __init__(self, box: Sandbox) -> None:
        if not isinstance(box, Helpers):
            raise SubstrateError(f"the {box.substrate} substrate keeps no helpers")
        self.box = box
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = ["python3", "-I", "-c", SOURCE, "--zygote", box.paths.work, str(box.helper_uid),
                    str(theirs.fileno())]
            self.helper: Helper = box.start_helper(argv, cwd=box.paths.root, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.sock.settimeout(_ANSWER_S)

    def serves(self, box: Sandbox) -> bool:
        """Was this zygote started in ``box`` (the very sandbox, not an equal one)?"""
        return self.box is box

    def alive(self) -> bool:
        return self.helper.alive()

    def open(self) -> ZygoteStream | None:
        """A fresh server, or None when the zygote does not answer (it is stopped then)."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            socket.send_fds(self.sock, [b"go"], [in_r, out_w])
            _msg, fds, _flags, _addr = socket.recv_fds(self.sock, 32, 1)
        except OSError:
            fds = []
        finally:
            os.close(in_r)
            os.close(out_w)
        if len(fds) != 1:
            for fd in (*fds, in_w, out_r):
                os.close(fd)
            self.stop()
            return None
        return ZygoteStream(fds[0], in_w, out_r, self.box.end_processes)

    def stop(self) -> None:
        self.helper.stop()
        with contextlib.suppress(OSError):
            self.sock.close()
