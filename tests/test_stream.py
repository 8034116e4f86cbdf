"""``Streaming``: a command in a sandbox whose stdin and stdout the harness holds as pipes.

Per substrate (one substrate and one sandbox per module and substrate): line round trips as the
sandbox's uid in the folder asked for, ``close`` killing the command and the background children it
started (one in a session of its own), EOF on stdin, ``end_processes`` killing a stream's command,
a stream opened by a thread that has ended, a missing working folder. On vm the command runs in the
guest (the agent's streams) and its processes are found there."""

from __future__ import annotations

import os
import select
import threading
import time
import uuid

import pytest

from drumsbench.substrates import registry
from drumsbench.substrates.base import Stream, Streaming
from drumsbench.substrates.hostproc import pids_with_env

from conftest import require

SUBSTRATES = ["process", "bwrap", "overlay", "docker", "podman", "vm"]
MARK_VAR = "DRUMSBENCH_TEST_STREAM"

# Prints the pids of two background `sleep`s (which keep the stream's stdout; the second in a session
# of its own), then answers each line with the line, its uid and its working folder.
ECHO = r"""
import os, sys
os.system("sleep 1000 & echo $!; setsid sleep 1001 & echo $!")
while True:
    line = sys.stdin.readline()
    if not line:
        break
    sys.stdout.write("%s %d %s\n" % (line.rstrip("\n"), os.getuid(), os.getcwd()))
"""

ALIVE = r"""
import sys
try:
    state = open("/proc/%s/stat" % sys.argv[1]).read().rsplit(")", 1)[1].split()[0]
except OSError:
    state = "gone"
print("gone" if state in ("gone", "Z", "X") else "alive")
"""


@pytest.fixture(scope="module", params=SUBSTRATES)
def box(request, tmp_path_factory):
    cls = registry.get(request.param)
    require(cls.missing())
    assert cls.sandbox_class is not None and issubclass(cls.sandbox_class, Streaming)
    run_id = "t" + uuid.uuid4().hex[:10]
    state_dir = tmp_path_factory.mktemp("state")
    sub = cls(run_id, state_dir)
    sandbox = sub.create()
    try:
        yield sandbox
    finally:
        sandbox.destroy()
        sub.close()
        left = sub.leftovers()
        cls.gc(state_dir, {run_id})
        assert not left, left


class Lines:
    """Reads lines from a stream's stdout with a deadline."""

    def __init__(self, stream: Stream) -> None:
        self.fd = stream.stdout_fd
        self.buf = b""
        self.eof = False

    def _more(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        assert left > 0, f"no output within the deadline (have {self.buf!r})"
        ready, _, _ = select.select([self.fd], [], [], left)
        if ready:
            chunk = os.read(self.fd, 65536)
            self.buf += chunk
            self.eof = not chunk

    def line(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            assert not self.eof, f"EOF before a whole line (have {self.buf!r})"
            self._more(deadline)
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def until_eof(self, timeout: float = 15.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not self.eof:
            self._more(deadline)
        return self.buf


def sandbox_uid(box) -> int:
    res = box.exec(["id", "-u"], timeout=30)
    assert res.exit_code == 0, res
    return int(res.stdout)


# Prints the pids of the guest's processes whose environment has MARK_VAR=argv[1]
GUEST_MARKED = r"""
import os, sys
want = ("%s=%s" % (sys.argv[2], sys.argv[1])).encode()
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and want in open("/proc/%s/environ" % pid, "rb").read().split(b"\0"):
            print(pid)
    except OSError:
        pass
"""


def marked(box, mark: str) -> dict[int, str]:
    """The stream's processes: host processes (the sandbox's are, containers' too), or the guest's
    (vm), found by their mark."""
    if box.substrate != "vm":
        return pids_with_env(MARK_VAR, mark)
    res = box.exec(["python3", "-c", GUEST_MARKED, mark, MARK_VAR], timeout=30, cwd=box.paths.root)
    assert res.exit_code == 0, res
    return {int(pid): "" for pid in res.stdout.split()}


def wait_unmarked(box, mark: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while marked(box, mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked(box, mark), f"processes of the stream still run: {marked(box, mark)}"


def in_sandbox(box, pid: int) -> str:
    """"alive" or "gone", as the sandbox sees ``pid`` (not for bwrap: each command has its own pid namespace)."""
    res = box.exec(["python3", "-c", ALIVE, str(pid)], timeout=30, cwd=box.paths.root)
    assert res.exit_code == 0, res
    return res.stdout.decode().strip()


def open_echo(box, mark: str, **kw) -> tuple[Stream, Lines, list[int]]:
    stream = box.open_stream(["python3", "-u", "-c", ECHO], env={MARK_VAR: mark}, **kw)
    lines = Lines(stream)
    return stream, lines, [int(lines.line()), int(lines.line())]


def test_round_trips_uid_cwd_and_close(box):
    uid = sandbox_uid(box)
    mark = uuid.uuid4().hex
    stream, lines, children = open_echo(box, mark, cwd=box.paths.tmp)
    try:
        for i in range(5):
            text = f"line {i} " + "x" * (i * 1000)
            os.write(stream.stdin_fd, text.encode() + b"\n")
            assert lines.line() == f"{text} {uid} {box.paths.tmp}"
        assert stream.poll() is None
        # the command and its sleeps, as the checks below see them (a process in the middle of an
        # exec shows no environment for a moment). The checks read the scan the wait ended on: in CI
        # one later scan of a podman stream missed one of the three that the scans before and after it
        # saw, so a second scan is not the same evidence.
        deadline = time.monotonic() + 5
        seen = marked(box, mark)
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = marked(box, mark)
        assert len(seen) >= 3, seen
        # the host-process substrates': the sandbox's limits (a vm's group holds QEMU, not the guest's)
        cgroup = getattr(box, "cgroup", None) if box.substrate != "vm" else None
        if cgroup is not None:
            assert set(seen) <= set(cgroup.procs()), (seen, cgroup.procs())
        if box.substrate != "bwrap":
            assert [in_sandbox(box, pid) for pid in children] == ["alive", "alive"]
    finally:
        code = stream.close()
    assert code is not None and code != 0
    assert stream.close() == code  # idempotent
    assert stream.poll() == code
    with pytest.raises(ValueError):
        stream.stdout_fd  # noqa: B018 - closed
    wait_unmarked(box, mark)
    if box.substrate != "bwrap":
        assert [in_sandbox(box, pid) for pid in children] == ["gone", "gone"]


def test_eof_ends_the_command(box):
    """``close_stdin``: the command reads EOF, ends, and its status is the command's (its background
    children, still holding stdout, are killed by ``close``)."""
    mark = uuid.uuid4().hex
    stream, lines, _ = open_echo(box, mark)
    try:
        os.write(stream.stdin_fd, b"only\n")
        assert lines.line() == f"only {sandbox_uid(box)} {box.paths.work}"
        stream.close_stdin()
        deadline = time.monotonic() + 15
        while stream.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream.poll() == 0
    finally:
        assert stream.close() == 0
    wait_unmarked(box, mark)


def test_end_processes_kills_a_stream(box):
    """Opened by a thread that ends before the stream is used (bwrap's parent-death signal must not
    follow that thread); ``end_processes`` kills the command and its child: stdout reaches EOF."""
    mark = uuid.uuid4().hex
    opened: list[tuple[Stream, Lines, list[int]]] = []
    t = threading.Thread(target=lambda: opened.append(open_echo(box, mark)))
    t.start()
    t.join(60)
    stream, lines, children = opened[0]
    try:
        time.sleep(0.2)
        os.write(stream.stdin_fd, b"ping\n")
        assert lines.line().startswith("ping ")
        box.end_processes()
        assert lines.until_eof() == b""
        deadline = time.monotonic() + 10
        while stream.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream.poll() not in (None, 0)
        wait_unmarked(box, mark)
        if box.substrate != "bwrap":
            assert [in_sandbox(box, pid) for pid in children] == ["gone", "gone"]
    finally:
        stream.close()


def test_missing_working_folder(box):
    stream = box.open_stream(["true"], cwd=f"{box.paths.work}/no-such-folder")
    try:
        deadline = time.monotonic() + 15
        while stream.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code = stream.poll()
        assert code is not None and code != 0
        if box.substrate in ("process", "bwrap", "overlay"):
            assert code == 126
    finally:
        stream.close()
