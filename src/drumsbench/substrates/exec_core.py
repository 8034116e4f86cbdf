"""The exec core of the substrates: what running one command in a sandbox takes, written once.

- ``sandbox_env``: the environment every sandbox command starts from (PATH, HOME, TMPDIR, LANG,
  no bytecode files, the sandbox's labels), then the caller's additions;
- ``missing_workdir``: the result of a command whose working folder a previous command removed
  (the command's outcome, exit 126, not the substrate's failure);
- ``run_bounded``: a host process in a new session with a timeout and output kept head and tail
  (``HeadTail``), its whole process group killed on timeout (``kill_group``);
- ``ProcessGroups``: the process groups a sandbox's commands started, for killing them later;
- ``start_stream``: a host process whose stdin and stdout the harness holds (``base.Stream``), killed
  by process group and by its token (``EXEC_VAR``) when closed.

``Sandbox.exec`` (base) turns a call into an ``ExecRequest``; each substrate's ``_run`` takes it
from there with these pieces (containers and the vm bound and kill inside the sandbox instead).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import ExecRequest, ExecResult, SandboxPaths, Stream
from drumsbench.substrates.hostproc import kill_pids, pids_with_env
from drumsbench.substrates.spawner import SpawnedProcess, Spawner, SpawnTimeout

# PATH of every sandbox command (host, container or guest: the same Debian layout)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The environment variable that marks every process of one command (its token): what kills the
# command's tree finds them by it, also those that left its session
EXEC_VAR = "DRUMSBENCH_EXEC"


def sandbox_env(paths: SandboxPaths, extra: Mapping[str, str] | None, *, labels: Mapping[str, str] | None = None,
                pinned: Mapping[str, str] | None = None) -> dict[str, str]:
    """A command's environment: the sandbox's defaults and ``labels``, then the caller's ``extra``,
    then ``pinned`` (what a caller's environment must not hide, e.g. a kill token)."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": paths.home,
        "TMPDIR": paths.tmp,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(labels or {}),
    }
    env.update(extra or {})
    env.update(pinned or {})
    return env


def missing_workdir(workdir: str) -> ExecResult:
    """The sandbox lives; its working folder does not (a command may have removed it): that is the
    command's outcome, not the substrate's failure."""
    msg = f"drumsbench: working folder {workdir} does not exist\n".encode()
    return ExecResult(exit_code=126, stdout=b"", stderr=msg, stdout_total=0, stderr_total=len(msg),
                      timed_out=False, duration_s=0.0)


class ProcessGroups:
    """The process groups (one per command: each runs in a new session) a sandbox started."""

    def __init__(self) -> None:
        self._groups: set[int] = set()
        self._lock = threading.Lock()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)

    def forget(self, pgids: Iterable[int], *, only_empty: bool = True) -> None:
        """Forget groups (with ``only_empty``: those with no member left) before the kernel can
        reuse their ids for unrelated groups."""
        for pgid in list(pgids):
            if only_empty:
                try:
                    os.killpg(pgid, 0)
                    continue
                except ProcessLookupError:
                    pass
                except PermissionError:
                    continue
            with self._lock:
                self._groups.discard(pgid)

    def forget_empty(self) -> None:
        with self._lock:
            groups = list(self._groups)
        self.forget(groups)

    def kill(self) -> None:
        """SIGKILL every group and forget them all."""
        with self._lock:
            groups, self._groups = self._groups, set()
        for pgid in groups:
            kill_group(pgid)

    def run(self, argv: Sequence[str], req: ExecRequest, *, cwd: str | None, env: Mapping[str, str],
            uid: int | None = None, forget_all: bool = False, spawner: Spawner | None = None,
            spawn_argv: Sequence[str] | None = None) -> ExecResult:
        """``run_bounded`` of the host command ``argv`` for ``req`` (its timeout, stdin and output
        limit), its group counted while it runs; afterwards the group is forgotten when empty
        (``forget_all``: in any case, for a sandbox whose processes die with something else, e.g.
        a pid namespace)."""
        started: list[int] = []

        def remember(pid: int) -> None:
            started.append(pid)
            self.add(pid)

        try:
            return run_bounded(argv, timeout=req.timeout, cwd=cwd, env=env, stdin=req.stdin,
                               output_limit=req.output_limit, on_start=remember, uid=uid, spawner=spawner,
                               spawn_argv=spawn_argv)
        finally:
            self.forget(started, only_empty=not forget_all)


# How long run_bounded waits for a SIGKILLed command to be reaped before it gives up on it (a
# command in a frozen cgroup cannot die until the cgroup is thawed).
_REAP_WAIT_S = 0.5

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
    uid: int | None = None,
    spawner: Spawner | None = None,
    spawn_argv: Sequence[str] | None = None,
) -> ExecResult:
    """Run ``argv`` in a new session; return its exit code and at most ``output_limit`` bytes per stream.

    ``uid``: run as that uid, with the gid of the same number and no supplementary groups.
    ``spawner`` (with ``spawn_argv``, the command without what places it in the sandbox's groups):
    started by the sandbox's spawner (``substrates/spawner.py``) when it can, else ``argv`` the
    usual way; a spawner that does not answer within ``timeout`` gives a timed-out result.
    On timeout the process group is killed; a command that still does not die (its cgroup is
    frozen) is left to ``subprocess``'s reaping after ``_REAP_WAIT_S``: the harness never blocks
    on it. Raises ``SubstrateError`` only when the process cannot be started at all.
    """
    t0 = time.monotonic()
    proc: subprocess.Popen[bytes] | SpawnedProcess | None = None
    if spawner is not None and spawn_argv is not None and cwd is not None:
        try:
            proc = spawner.spawn(spawn_argv, cwd=cwd, env=env or {}, stdin=stdin is not None, timeout=timeout)
        except SpawnTimeout:  # the spawner did not answer: its sandbox is frozen, or starved
            return ExecResult(exit_code=-signal.SIGKILL, stdout=b"", stderr=b"", stdout_total=0, stderr_total=0,
                              timed_out=True, duration_s=time.monotonic() - t0)
    if proc is None:
        creds: dict = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                **creds,
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
    pidfd = proc.pidfd if isinstance(proc, SpawnedProcess) else os.pidfd_open(proc.pid)
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
                # a background child still holds the output open: do not wait for it, but keep what
                # is already in the pipes (a harness thread descheduled past the grace under load
                # must not drop output the command wrote before it exited)
                _drain_ready(sel, keepers)
                break
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
            # A frozen process cannot die: wait for it only a bounded time.
            if exited_at is None and not _pidfd_ready(pidfd, _REAP_WAIT_S):
                code = proc.poll()
                if code is None:
                    code = -signal.SIGKILL
            else:
                code = proc.wait()
        else:
            code = proc.wait()
    finally:
        sel.close()
        if isinstance(proc, SpawnedProcess):
            proc.close()
        else:
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


def _drain_ready(sel: selectors.BaseSelector, keepers: dict[str, HeadTail], max_chunks: int = 256) -> None:
    """Read what the output pipes hold now, without waiting (at most ``max_chunks`` reads: a child
    that keeps writing cannot hold the harness here)."""
    for _ in range(max_chunks):
        ready = [key for key, _ in sel.select(0) if key.data in keepers]
        if not ready:
            return
        for key in ready:
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            keepers[key.data].add(chunk)


def _pidfd_ready(pidfd: int, timeout: float) -> bool:
    sel = selectors.DefaultSelector()
    try:
        sel.register(pidfd, selectors.EVENT_READ)
        return bool(sel.select(timeout))
    finally:
        sel.close()


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




# -- streams (``base.Stream``) ------------------------------------------------------------------


class PipeStream(Stream):
    """A ``Stream`` over two pipe ends the harness owns (``stdin_fd``: a write end, ``stdout_fd``: a
    read end); subclasses say how to ask about the command (``_status``), kill its tree (``_kill``,
    before the ends close: closing stdin first would let the command end by itself, its status then
    depending on a race) and reap it (``_reap``, after)."""

    def __init__(self, stdin_fd: int, stdout_fd: int) -> None:
        self._in = stdin_fd
        self._out = stdout_fd
        self._lock = threading.Lock()
        self._closed = False
        self._code: int | None = None

    @property
    def stdin_fd(self) -> int:
        if self._in < 0:
            raise ValueError("the stream's stdin is closed")
        return self._in

    @property
    def stdout_fd(self) -> int:
        if self._out < 0:
            raise ValueError("the stream is closed")
        return self._out

    def close_stdin(self) -> None:
        with self._lock:
            fd, self._in = self._in, -1
        if fd >= 0:
            os.close(fd)

    def poll(self) -> int | None:
        return self._code if self._closed else self._status()

    def close(self, timeout: float = 5.0) -> int | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return self._code
            self._closed = True
        try:
            self._kill(timeout)
        finally:
            with self._lock:
                fds, self._in, self._out = (self._in, self._out), -1, -1
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
        self._code = self._reap(max(0.0, deadline - time.monotonic()))
        return self._code

    def _status(self) -> int | None:
        """The exit status once the command ended (``poll`` before ``close``)."""
        raise NotImplementedError

    def _kill(self, timeout: float) -> None:
        """Kill the command's tree (the harness's ends are still open); never raises for a sandbox
        that is gone."""

    def _reap(self, timeout: float) -> int | None:
        """The exit status, waited for at most ``timeout`` s (the harness's ends are closed)."""
        raise NotImplementedError


class EndedStream(PipeStream):
    """The stream of a command that could not start: stdout at EOF, stdin a pipe nobody reads."""

    def __init__(self, code: int) -> None:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        os.close(in_r)
        os.close(out_w)
        super().__init__(in_w, out_r)
        self._ended = code

    def _status(self) -> int | None:
        return self._ended

    def _reap(self, timeout: float) -> int | None:
        return self._ended


class PopenStream(PipeStream):
    """A host process started by ``start_stream``."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin_fd: int, stdout_fd: int, *,
                 groups: ProcessGroups | None, token: str | None, on_close: Callable[[], None] | None) -> None:
        super().__init__(stdin_fd, stdout_fd)
        self.proc = proc
        self._groups = groups
        self._token = token
        self._on_close = on_close

    @property
    def pid(self) -> int:
        """The host pid of the process started (held, unreaped, until ``close``)."""
        return self.proc.pid

    def _status(self) -> int | None:
        # not reaped (WNOWAIT): the pid, and with it the process group's id, stays ours until ``close``
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.proc.returncode
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _kill(self, timeout: float) -> None:
        kill_group(self.proc.pid)
        # what left the session, by its token (a process in the middle of an exec shows no
        # environment for a moment: passes until one finds nothing)
        for _ in range(3):
            pids = [] if self._token is None else list(pids_with_env(EXEC_VAR, self._token))
            if not pids:
                break
            kill_pids(pids, wait_s=timeout)
        if self._on_close is not None:
            with contextlib.suppress(SubstrateError):
                self._on_close()

    def _reap(self, timeout: float) -> int | None:
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # a frozen cgroup's process dies only when thawed
            code = None
        if self._groups is not None:
            self._groups.forget([self.proc.pid])
        return code


def start_stream(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str], uid: int | None = None,
                 groups: ProcessGroups | None = None, token: str | None = None,
                 on_close: Callable[[], None] | None = None) -> PopenStream:
    """Start the host command ``argv`` in a new session with stdin and stdout on pipes the harness
    holds (``base.Stream``), stderr discarded. ``uid``: as ``run_bounded``. ``groups``: the sandbox's
    groups, which count the command's (``end_processes`` and ``destroy`` kill it). ``close`` kills the
    process group, the processes whose environment carries ``EXEC_VAR=token`` (put it there), then
    runs ``on_close`` (e.g. a kill inside a container), then reaps. ``SubstrateError`` when the
    process cannot be started at all."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    creds: dict = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=in_r, stdout=out_w,
                                stderr=subprocess.DEVNULL, start_new_session=True, **creds)
    except OSError as e:
        os.close(in_w)
        os.close(out_r)
        raise SubstrateError(f"cannot start {argv[0]!r} in {cwd!r}: {e}") from e
    finally:
        os.close(in_r)
        os.close(out_w)
    if groups is not None:
        groups.add(proc.pid)
    return PopenStream(proc, in_w, out_r, groups=groups, token=token, on_close=on_close)
