"""A kept helper process of a host-process sandbox (``Helpers`` of ``substrates/base.py``).

``HostHelper`` wraps a ``subprocess.Popen`` that the sandbox started as the harness's uid, in the
sandbox's cgroups, in its own session, with stdin and stdout (stderr joined) held by the harness.
It speaks the ``Helper`` protocol: a request on stdin, an answer on stdout ending in one line
``HELPER_END <code>``. The harness is the helper's parent and reaps it only in ``stop``: until then
its pid cannot be reused, which is what lets the sandbox spare it by pid (``HostFolderSandbox.kill_all``).
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable

from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, Helper

# Output past this many times the caller's limit ends the helper: its answers are small (a few lines).
_FLOOD_FACTOR = 4
# How long ``stop`` waits for the killed helper to be reaped (a frozen one dies only when thawed).
_REAP_WAIT_S = 0.5
_END = re.compile(rb"(?:^|\n)" + re.escape(Helper.HELPER_END) + rb" (-?\d+)\n")


class HostHelper(Helper):
    """See the module. ``on_end(pid)`` is called once when the helper is stopped, before it is reaped."""

    def __init__(self, proc: subprocess.Popen[bytes], on_end: Callable[[int], None]) -> None:
        self._proc = proc
        self._on_end = on_end
        self._ended = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        if self._ended:
            return False
        try:  # not reaped: WNOWAIT leaves an exited helper a zombie, its pid still held
            running = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            running = False
        if not running:
            self.stop()
        return running

    def call(self, request: bytes, *, timeout: float, output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        t0 = time.monotonic()
        if not self.alive():
            return ExecResult(exit_code=-signal.SIGKILL, stdout=b"", stderr=b"the helper is not running",
                              stdout_total=0, stderr_total=0, timed_out=False, duration_s=0.0)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        out = bytearray()
        try:
            self._proc.stdin.write(request)
            self._proc.stdin.flush()
        except OSError:  # it ended: what it wrote before is read below
            pass
        fd = self._proc.stdout.fileno()
        deadline = t0 + timeout
        code: int | None = None
        timed_out = False
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                out += chunk
                m = _END.search(out)
                if m is not None:
                    code = int(m.group(1))
                    del out[m.start():]
                    break
                if len(out) > _FLOOD_FACTOR * output_limit:
                    break
        if code is None:  # timed out, flooded or ended without its line: it answers no more
            self.stop()
            code = -signal.SIGKILL if timed_out or self._proc.returncode is None else self._proc.returncode
        total = len(out)
        return ExecResult(exit_code=code, stdout=bytes(out[:output_limit]), stderr=b"", stdout_total=total,
                          stderr_total=0, timed_out=timed_out, duration_s=time.monotonic() - t0)

    def stop(self) -> None:
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(OSError):  # its session: the worker it forked dies with it
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._on_end(self._proc.pid)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=_REAP_WAIT_S)  # a frozen helper dies only when thawed
