"""Where the trusted judge runs: on the host, as the harness's uid, never in a sandbox.

``run_judge(stream, secret, config, timeout)`` runs one verification of ``judge.py`` against the
boundary server behind ``stream`` (a ``substrates.base.Stream``: the server in the sandbox) and
returns the judge's output lines (``DRUMSBENCH_READY`` / ``DRUMSBENCH_VERDICT``, authenticated with
``secret``; ``core.verdict_channel`` reads them).

The judge is forked per verification by a **kept judge** (``KeptJudge``): one process per harness
process, started on first use, that has imported the judge, ``unittest`` and the codec once; each
request hands it the stream's two descriptors and an output pipe over a Unix socket. Where the kept
judge cannot be started or has ended, a fresh ``python -I -m drumsbench.envs.coding.judge`` runs
instead (the same code, ~80 ms more). The kept judge ends when its socket's other end closes (the
harness process exits) and at ``atexit``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from drumsbench.substrates.base import Stream

JUDGE_MODULE = "drumsbench.envs.coding.judge"
MAX_OUTPUT = 1 << 20


def judge_stdin(secret: bytes, config: dict[str, Any]) -> bytes:
    return secret.hex().encode() + b"\n" + json.dumps(config).encode() + b"\n"


class KeptJudge:
    """The process-wide judge fork server (see the module docstring)."""

    _lock = threading.Lock()
    _instance: KeptJudge | None = None

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.proc = subprocess.Popen([sys.executable, "-I", "-m", JUDGE_MODULE, "--serve", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.send_lock = threading.Lock()

    @classmethod
    def get(cls) -> KeptJudge | None:
        """The running kept judge, started if needed; None when it cannot run."""
        with cls._lock:
            judge = cls._instance
            if judge is not None and judge.proc.poll() is None:
                return judge
            if judge is not None:
                judge.close()
            try:
                cls._instance = cls()
            except OSError:
                cls._instance = None
            return cls._instance

    def submit(self, fds: list[int], secret: bytes, config: dict[str, Any]) -> bool:
        msg = json.dumps({"secret": secret.hex(), "config": config}).encode()
        try:
            with self.send_lock:
                socket.send_fds(self.sock, [msg], fds)
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    @classmethod
    def stop(cls) -> None:
        with cls._lock:
            if cls._instance is not None:
                cls._instance.close()
                cls._instance = None


atexit.register(KeptJudge.stop)


def run_judge(stream: Stream, secret: bytes, config: dict[str, Any], timeout: float,
              python: str | None = None) -> tuple[list[str], bool, str]:
    """(output lines, timed out, how it ran: "kept judge" or "judge process"). ``python``: run a
    fresh judge with that interpreter instead of the kept judge (fault injection breaks it so)."""
    kept = KeptJudge.get() if python is None else None
    if kept is not None:
        out_r, out_w = os.pipe()
        try:
            sent = kept.submit([stream.stdout_fd, stream.stdin_fd, out_w], secret, config)
        finally:
            os.close(out_w)
        if sent:
            try:
                lines, timed_out = _read_lines(out_r, time.monotonic() + timeout)
            finally:
                os.close(out_r)
            if lines and lines[0].startswith("DRUMSBENCH_JUDGE_PID "):
                pid = int(lines[0].split()[1])
                if timed_out:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
                return lines[1:], timed_out, "kept judge"
        else:
            os.close(out_r)
    try:
        argv = [python or sys.executable, "-I", "-m", JUDGE_MODULE, str(stream.stdout_fd), str(stream.stdin_fd)]
        proc = subprocess.run(argv, input=judge_stdin(secret, config), capture_output=True, timeout=timeout,
                              pass_fds=(stream.stdout_fd, stream.stdin_fd), check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, bytes) else b""
        return out.decode(errors="replace").splitlines(), True, "judge process"
    except OSError as e:
        return [], False, f"judge process: {e.strerror}"
    return proc.stdout.decode(errors="replace").splitlines(), False, "judge process"


def _read_lines(fd: int, deadline: float) -> tuple[list[str], bool]:
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return buf.decode(errors="replace").splitlines(), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return buf.decode(errors="replace").splitlines(), False
        buf += chunk
        if len(buf) > MAX_OUTPUT:
            return buf[:MAX_OUTPUT].decode(errors="replace").splitlines(), False
