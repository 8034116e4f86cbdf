"""Run a host process with a timeout and bounded output; kill its whole process group on timeout.

Shared by the substrates whose sandboxes are host processes (process, bwrap, overlay, ...).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from drumsbench.errors import SubstrateError
from drumsbench.substrates.base import ExecResult

# After the main process exits, wait this long for background children to release stdout/stderr.
_DRAIN_GRACE_S = 0.2


def run_bounded(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | None,
    output_limit: int,
    on_start: Callable[[int], None] | None = None,
) -> ExecResult:
    """Run ``argv`` in a new session; return its exit code and at most ``output_limit`` bytes per stream.

    Raises ``SubstrateError`` only when the process cannot be started at all.
    """
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise SubstrateError(f"cannot start {argv[0]!r} in {cwd!r}: {e}") from e
    if on_start is not None:
        on_start(proc.pid)
    if stdin is not None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()

    keepers = {"out": HeadTail(output_limit), "err": HeadTail(output_limit)}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    # The process's exit wakes the loop through a pidfd: no polling, no sleeps.
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    deadline = t0 + timeout
    timed_out = False
    exited_at: float | None = None
    streams = 2
    try:
        while streams or exited_at is None:
            now = time.monotonic()
            if now >= deadline:
                timed_out = exited_at is None
                break
            if exited_at is not None and now - exited_at > _DRAIN_GRACE_S:
                break  # a background child still holds the output open: do not wait for it
            wait = deadline - now if exited_at is None else min(deadline - now, _DRAIN_GRACE_S)
            for key, _ in sel.select(wait):
                if key.data == "exit":
                    sel.unregister(pidfd)
                    proc.wait()
                    exited_at = time.monotonic()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    streams -= 1
                    continue
                keepers[key.data].add(chunk)
        if timed_out:
            kill_group(proc.pid)
        code = proc.wait()
    finally:
        sel.close()
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    return ExecResult(
        exit_code=code,
        stdout=keepers["out"].value(),
        stderr=keepers["err"].value(),
        stdout_total=keepers["out"].total,
        stderr_total=keepers["err"].total,
        timed_out=timed_out,
        duration_s=time.monotonic() - t0,
    )


class HeadTail:
    """Keeps the first and the last ``limit // 2`` bytes of a stream and counts all of it.

    The tail matters: a command's last lines (its error, a harness's end marker) are the ones
    that must survive truncation.
    """

    def __init__(self, limit: int) -> None:
        self.head_room = limit - limit // 2
        self.tail_room = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        take = min(len(chunk), self.head_room - len(self.head))
        if take > 0:
            self.head += chunk[:take]
            chunk = chunk[take:]
        if chunk and self.tail_room > 0:
            self.tail += chunk
            if len(self.tail) > self.tail_room:
                del self.tail[: len(self.tail) - self.tail_room]

    def value(self) -> bytes:
        return bytes(self.head + self.tail)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
